"""The job a Hydra run executes: validate, load the rollout, plan, write the run dir, train."""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from slime_hydra.config import job_of, validate
from slime_hydra.data.rollout import with_tokens
from slime_hydra.errors import SlimeHydraError, raise_stopped, stop_signal
from slime_hydra.files import write_file
from slime_hydra.instantiate import build
from slime_hydra.log.jsonl import rows_done
from slime_hydra.log.sink import RunInfo
from slime_hydra.rundir import (
    ERROR_FILE,
    LOG_FILE,
    RunDirError,
    RunDirLock,
    check_sweep_job_dir,
    claim,
    discard_run_files,
    holds_run,
    note_sweep_job,
    write_run_files,
)
from slime_hydra.schedule import violations
from slime_hydra.train.job import Job
from slime_hydra.train.run.nodes import node_rank
from slime_hydra.train.run.rank_output import setup_rank_output
from slime_hydra.train.run.start import check, start
from slime_hydra.train.run.torchrun import is_rank_zero, torchrun_env
from slime_hydra.train.settings import PlanTrainer

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
    """Checks, rollout, schedule and each step's planned metrics and time: everything before
    training, nothing written yet."""
    checked = validate(cfg)
    layout, strategy = checked.layout, checked.strategy
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
    return job_of(cfg, checked, run, rollout, schedule, OmegaConf.select(cfg, "data.tokenizer"))


def resuming(trainer: object) -> bool:
    """Whether this run continues the run in its dir: trainer.resume, or torchrun restarting
    its workers (each restarted rank runs the job again)."""
    env = torchrun_env()
    return bool(getattr(trainer, "resume", False)) or (env is not None and env.restart_count > 0)


@dataclass
class Attempt:
    """How far a run got: whether it wrote its run files (its dir is this run's from then on),
    and whether it failed."""

    wrote: bool = False
    failed: bool = False


def run(cfg: DictConfig, attempt: Attempt | None = None) -> float | None:
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
        if not isinstance(trainer, PlanTrainer):  # the workers train on tokens
            rollout = with_tokens(job.rollout, job.dims.vocab_size, job.seed)
            job = replace(job, rollout=rollout)
        if owner:
            claim(info.run_dir, info.config, resuming(trainer))
            rows_done(info.run_dir / "metrics.jsonl", steps_done=0)  # damaged lines: refused now
        check(trainer, job)
        written: list[Path] = []
        if owner:
            hydra = HydraConfig.get() if HydraConfig.initialized() else None
            written = write_run_files(info.run_dir, cfg, job.schedule.to_json(), hydra)
        refused = False
        if attempt is not None:
            attempt.wrote = True
        try:
            objective = start(trainer, job)
        except BaseException:
            if written and not resuming(trainer) and not started(info.run_dir):
                discard_run_files(info.run_dir, written)
                refused = True  # the lock's old content back too: the dir is as it was
                if attempt is not None:
                    attempt.wrote = False
            raise
    finally:
        if lock is not None:
            lock.release(refused=refused)
    log.info("Run dir: %s", job.run.run_dir)
    return objective


def started(run_dir: Path) -> bool:
    """Whether a run in `run_dir` logged a step or saved a checkpoint (a damaged metrics file
    counts as started: it is never discarded)."""
    if os.path.lexists(run_dir / "checkpoints"):
        return True
    try:
        return bool(rows_done(run_dir / "metrics.jsonl", steps_done=2**63 - 1))
    except SlimeHydraError:
        return True


def _stopped_line(signum: int, run_dir: Path, attempt: Attempt) -> str:
    """One line for a run stopped by a signal: what became of its dir and how to go on."""
    name = signal.Signals(signum).name
    if not attempt.wrote:
        return f"stopped by {name} before training started: nothing was written to {run_dir}."
    if (run_dir / "checkpoints" / "latest").is_file():
        return (
            f"stopped by {name}: the run in {run_dir} keeps its last checkpoint; continue it "
            f"with trainer.resume=true hydra.run.dir={run_dir} (trainer=cpu|gpu)."
        )
    try:
        steps = f"{len(rows_done(run_dir / 'metrics.jsonl', steps_done=2**63 - 1))} step(s)"
    except SlimeHydraError:
        steps = "steps"
    return (
        f"stopped by {name}: the run in {run_dir} logged {steps} to metrics.jsonl and saved no "
        "checkpoint (trainer=plan saves none; trainer.save_interval=N saves every N steps), so "
        "it cannot be resumed: rerun it with a new hydra.run.dir."
    )


def _record_failure(job_dir: Path, text: str, held_before: bool, attempt: Attempt) -> None:
    """A sweep job's error.txt, in its own dir only: one that held no run when the job began,
    or whose run files this job wrote."""
    if attempt.wrote or not held_before:
        write_file(job_dir / ERROR_FILE, f"{text}\n", job_dir)


def main(cfg: DictConfig) -> float | None:
    """Run, turning a user error into one paragraph: exit 1 in a single run; in a sweep, fail
    only this job (its error.txt says why, unless its dir holds another run; its objective is
    +inf) and go on with the others; in a sweep any other exception of the job fails it alike
    (its traceback in the job's log). SIGINT/SIGTERM stop the run with one line, exit 130/143."""
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    sweep_dir = Path(hydra_cfg.sweep.dir)
    if multirun:  # first: the sweep line counts this job however early it stops
        _note(sweep_dir, job_dir, None, hydra_cfg.job.num)
    held_before = bool(holds_run(job_dir))
    attempt = Attempt()
    signal.signal(signal.SIGTERM, raise_stopped)
    if not multirun:
        return _main(cfg, job_dir, held_before, attempt)
    objective = _main(cfg, job_dir, held_before, attempt, multirun=True)
    _note(sweep_dir, job_dir, attempt.failed)
    return objective


def _note(sweep_dir: Path, job_dir: Path, failed: bool | None, num: int | None = None) -> None:
    """note_sweep_job; one that cannot be written (a link planted in the sweep dir while it
    runs, a full disk) is logged, and the job goes on: the sweep line then counts it by its
    dir."""
    try:
        note_sweep_job(sweep_dir, job_dir, failed, num)
    except (SlimeHydraError, OSError) as exc:
        log.error("the sweep line will not count %s: %s", job_dir, exc)


def _main(
    cfg: DictConfig, job_dir: Path, held_before: bool, attempt: Attempt, multirun: bool = False
) -> float | None:
    try:
        if multirun:
            hydra_cfg = HydraConfig.get()
            subdir = OmegaConf.to_container(hydra_cfg.sweep, resolve=False)["subdir"]
            check_sweep_job_dir(Path(hydra_cfg.sweep.dir), job_dir, hydra_cfg.job.num, subdir)
        return run(cfg, attempt)
    except SlimeHydraError as exc:
        log.error("%s", exc)
        if not multirun:
            sys.exit(1)
        attempt.failed = True
        if not isinstance(exc, RunDirError):  # never into another run's dir
            _record_failure(job_dir, str(exc), held_before, attempt)
        return math.inf
    except BaseException as exc:  # a stop (Ctrl-C, SIGTERM, the launcher's), or a failure
        signum = stop_signal(exc)
        if signum is not None:
            log.error("%s", _stopped_line(signum, job_dir, attempt))
            sys.exit(128 + signum)
        if not multirun or not isinstance(exc, Exception):
            raise
        log.exception("sweep job %s failed", job_dir)
        attempt.failed = True
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        _record_failure(
            job_dir,
            f"{type(exc).__name__}: {first} (the traceback is in {job_dir / LOG_FILE})",
            held_before,
            attempt,
        )
        return math.inf
