"""The job a Hydra run executes: validate, load the rollout, plan, write the run dir, train."""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from slime_hydra.config import validate
from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checks import model_dims
from slime_hydra.instantiate import build, factory
from slime_hydra.log.sink import RunInfo
from slime_hydra.rundir import (
    ERROR_FILE,
    RunDirError,
    RunDirLock,
    claim,
    holds_run,
    write_run_files,
)
from slime_hydra.schedule import violations
from slime_hydra.train.job import Job
from slime_hydra.train.nodes import node_rank
from slime_hydra.train.rank_output import setup_rank_output
from slime_hydra.train.torchrun import is_rank_zero, torchrun_env

log = logging.getLogger("slime_hydra")


def run_info(cfg: DictConfig) -> RunInfo:
    """This job's identity from Hydra: run dir, resolved config, overrides, sweep, trainer."""
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    return RunInfo(
        run_dir=Path(hydra_cfg.runtime.output_dir),
        config=OmegaConf.to_container(cfg, resolve=True),
        name=hydra_cfg.job.override_dirname or "run",
        group=Path(hydra_cfg.sweep.dir).name if multirun else None,
        job_type=hydra_cfg.runtime.choices.get("trainer") or "plan",
    )


def plan(cfg: DictConfig, run: RunInfo) -> Job:
    """Checks, rollout and schedule: everything before training, nothing written yet."""
    layout, strategy = validate(cfg)
    dims = model_dims(cfg.model)
    rollout = build(cfg.data).load()
    start = time.perf_counter()
    schedule = strategy.plan(rollout.total_lengths, rollout.group_ids, rollout.step_ids)
    log.info(
        "Planned %d steps of %d samples for dp=%d with %s in %.1f ms",
        len(schedule.steps),
        len(rollout),
        layout.dp,
        strategy.name,
        (time.perf_counter() - start) * 1e3,
    )
    broken = violations(
        schedule, layout, rollout.group_ids, allow_oversize=strategy.isolates_oversize
    )
    if broken:
        log.warning(
            "%s's schedule breaks %d invariants (measured, not fixed), e.g. %s",
            strategy.name,
            len(broken),
            "; ".join(broken[:3]),
        )
    return Job(
        run=run,
        layout=layout,
        strategy=strategy,
        rollout=rollout,
        schedule=schedule,
        dims=dims,
        seed=cfg.seed,
        iterator=factory(cfg.iterator),
        pad_multiple=cfg.iterator.get("pad_multiple"),
        logger=factory(cfg.logger),
        tokenizer=OmegaConf.select(cfg, "data.tokenizer"),
    )


def resuming(trainer: object) -> bool:
    """Whether this run continues the run in its dir: trainer.resume, or torchrun restarting
    its workers (each restarted rank runs the job again)."""
    env = torchrun_env()
    return bool(getattr(trainer, "resume", False)) or (env is not None and env.restart_count > 0)


def run(cfg: DictConfig) -> float | None:
    """Lock the run dir, plan, let the run dir and the trainer refuse what they cannot take,
    and only then write the run dir and train: a refused run leaves the dir as it was. The
    trainer logs through `log.sinks.open_sinks` where its metrics are (this process for plan,
    rank 0's worker for cpu/gpu). Returns the trainer's objective for sweepers (plan: the
    simulated seconds, +inf for a step that breaks the cap or trainer.memory_limit_gib)."""
    env = torchrun_env()
    # Before planning imports megatron: third-party warnings once, other ranks quiet.
    setup_rank_output(node_rank() if env is None else env.rank)
    info = run_info(cfg)
    # Under torchrun every rank plans; rank 0 alone owns (locks, checks, writes) the run dir.
    owner = is_rank_zero()
    lock = RunDirLock(info.run_dir).acquire() if owner else None
    refused = True
    try:
        job = plan(cfg, info)
        trainer = build(cfg.trainer)
        if owner:
            claim(info.run_dir, info.config, resuming(trainer))
        trainer.check(job)
        if owner:
            hydra = HydraConfig.get() if HydraConfig.initialized() else None
            write_run_files(info.run_dir, cfg, job.schedule.to_json(), hydra)
        refused = False
        objective = trainer.run(job)
    finally:
        if lock is not None:
            lock.release(refused=refused)
    log.info("Run dir: %s", job.run.run_dir)
    return objective


def main(cfg: DictConfig) -> float | None:
    """Run, turning a user error into one paragraph: exit 1 in a single run; in a sweep, fail
    only this job (its error.txt says why, unless its dir holds another run; its objective is
    +inf) and go on with the others."""
    try:
        return run(cfg)
    except SlimeHydraError as exc:
        log.error("%s", exc)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            job_dir = Path(HydraConfig.get().runtime.output_dir)
            if not isinstance(exc, RunDirError) and not holds_run(job_dir):
                (job_dir / ERROR_FILE).write_text(f"{exc}\n")  # never into another run's dir
            return math.inf
        sys.exit(1)
