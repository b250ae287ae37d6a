"""The step loop every rank runs: fault injection, one engine step per scheduled step,
metrics and a progress line on rank 0, checkpoints on the save interval and at the end.

The schedule's steps are 0-indexed; everything users see counts from 1 (schedule.step_number):
step k of N in metrics and the console, the checkpoint after step k named k, trainer.* steps."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable

import torch.distributed as dist
from megatron.core import parallel_state

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError
from slime_hydra.log.sink import Sink
from slime_hydra.schedule import StepSchedule
from slime_hydra.schedule.schedule import step_number
from slime_hydra.train.job import Job
from slime_hydra.train.run import checkpoint
from slime_hydra.train.run.drift import DriftCheck
from slime_hydra.train.run.torchrun import TorchrunEnv
from slime_hydra.train.settings import CpuTrainer
from slime_hydra.train.step.engine import MegatronEngine, StepResult

log = logging.getLogger(__name__)


def microbatches(job: Job, index: int) -> MicrobatchIterator:
    """This rank's micro-batches of the schedule's step `index`: the `iterator` config's
    object, completed."""
    return rank_microbatches(job.iterator, job.rollout, job.schedule.steps[index])


def rank_microbatches(
    iterator: Callable[..., MicrobatchIterator], rollout: RolloutBatch, step: StepSchedule
) -> MicrobatchIterator:
    """An iterator class (or partial) completed with this rank's share of `step` and its DP,
    TP and CP place in megatron's parallel state."""
    dp_rank = parallel_state.get_data_parallel_rank()
    return iterator(
        rollout,
        step.ranks[dp_rank],
        step=step_number(step.step),
        dp_rank=dp_rank,
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        cp_size=parallel_state.get_context_parallel_world_size(),
        cp_rank=parallel_state.get_context_parallel_rank(),
    )


def run_steps(
    engine: MegatronEngine,
    trainer: CpuTrainer,
    job: Job,
    env: TorchrunEnv,
    steps_done: int,
    num_steps: int,
    sink: Sink,
    counters: dict[str, int] | None = None,
) -> None:
    """Train steps steps_done+1..num_steps (counted from 1); `sink` is rank 0's (one that does
    nothing elsewhere, where the progress line is below the log level too, rank_output.py);
    `counters` are the loop's counts saved with the checkpoint it resumes from. Each step's row
    puts the plan's prediction and batch/* metrics (job.planned) beside what was measured."""
    counters = {"skipped_steps": 0, **(counters or {})}
    digest = checkpoint.schedule_digest(job.schedule)
    drift = DriftCheck(trainer.cost) if trainer.cost is not None and env.rank == 0 else None
    begun = time.perf_counter()
    for index in range(steps_done, num_steps):
        step = step_number(index)
        if (
            step == trainer.fail_at_step
            and env.restart_count == 0
            and env.rank == env.world_size - 1
        ):
            log.error(
                "trainer.fail_at_step=%d: rank %d exits now (fault injection)", step, env.rank
            )
            os._exit(1)
        tic = time.perf_counter()
        rank_mbs = microbatches(job, index)
        result = engine.train_step(rank_mbs)
        step_s = time.perf_counter() - tic
        trained = result.metrics()
        if result.overflow:
            counters["skipped_steps"] += 1
            log.info(
                "step %d: fp16 loss-scale overflow at scale %g: the optimizer skipped the step "
                "and lowers the scale",
                step,
                result.loss_scale,
            )
        elif step_skipped(result, step, trainer.skip_nonfinite, job):
            counters["skipped_steps"] += 1
        tokens = sum(job.schedule.lengths[i] for i in job.schedule.steps[index].samples)
        planned = job.planned[index]
        sim_ratio = step_s / planned.timing.step_s
        sink.log(
            {
                "step": step,
                **trained,
                "train/skipped_steps": counters["skipped_steps"],
                "perf/step_s": step_s,
                "perf/tokens_per_s": tokens / step_s,
                "sim/step_s": planned.timing.step_s,
                "sim/bubble_frac": planned.timing.bubble_frac,
                "perf/sim_ratio": sim_ratio,
                **planned.metrics,
            }
        )
        if drift is not None and (warning := drift.observe(step, sim_ratio)):
            log.warning("%s", warning)
        eta = (time.perf_counter() - begun) / (step - steps_done) * (num_steps - step)
        log.info(
            "step %d/%d  loss %.4f  grad_norm %.3f  %.2f s  %.0f tok/s  eta %.0f s",
            step,
            num_steps,
            result.loss,
            result.grad_norm,
            step_s,
            tokens / step_s,
            eta,
        )
        if step == num_steps or (trainer.save_interval and step % trainer.save_interval == 0):
            save(engine, job, env, step, digest, counters, trainer.export_hf)


def step_skipped(result: StepResult, step: int, skip_nonfinite: bool, job: Job) -> bool:
    """The step policy for a non-finite loss or gradient norm (the values are global, so every
    rank decides alike): a finite step counts; a step the optimizer skipped (it left the weights
    as they were) is skipped and counted when trainer.skip_nonfinite=true; anything else stops
    the run before it saves, so the last checkpoint is the last good one."""
    skipped = result.skipped
    values = (result.loss, result.grad_norm)
    finite = all(v is not None and math.isfinite(v) for v in values)
    if finite and not skipped:
        return False
    if skip_nonfinite and skipped:
        log.warning("step %d: the optimizer skipped it (loss %s, grad_norm %s)", step, *values)
        return True
    root = checkpoint.checkpoint_root(job.run.run_dir)
    last = checkpoint.latest_step(job.run.run_dir)
    kept = (
        f"the last good checkpoint is after step {last} ({root}; trainer.resume=true "
        "continues from it)"
        if last
        else "no checkpoint was saved before it"
    )
    if skipped:
        what = "the optimizer skipped the step (a gradient overflow or non-finite norm)"
        fix = "set trainer.skip_nonfinite=true to skip and count such steps"
    elif skip_nonfinite:
        what = "the optimizer applied the update anyway, so the weights cannot be trusted"
        fix = "lower trainer.lr or check the rollout"
    else:
        what = "the update would spread NaN/inf into the weights"
        fix = (
            "check the rollout's rewards, advantages and log-probs, lower trainer.lr, or set "
            "trainer.skip_nonfinite=true to skip steps the optimizer skips"
        )
    raise SlimeHydraError(
        f"step {step}: train/loss={result.loss} train/grad_norm={result.grad_norm} is not "
        f"finite; {what}. Training stopped without saving: {kept}. To go on, {fix}."
    )


def save(
    engine: MegatronEngine,
    job: Job,
    env: TorchrunEnv,
    steps_done: int,
    digest: str,
    counters: dict[str, int] | None = None,
    export: bool = False,
) -> None:
    """Every rank saves its state after step `steps_done`; once all have, rank 0 marks the
    checkpoint as the latest; with `export` (trainer.export_hf), all ranks then write
    <run dir>/hf/ together."""
    run_dir = job.run.run_dir
    ident = checkpoint.identity(job.layout, job.dims)
    checkpoint.save(
        run_dir, steps_done, env.rank, engine.model, engine.optimizer, digest, ident, counters
    )
    dist.barrier()
    if env.rank == 0:
        checkpoint.mark_latest(run_dir, steps_done)
        log.info(
            "Saved checkpoint after step %d in %s",
            steps_done,
            checkpoint.checkpoint_root(run_dir),
        )
    if export:
        from slime_hydra.train.step.hf_bridge import export_hf

        export_hf(engine.chunks, job.dims, run_dir / "hf")
        if env.rank == 0:
            log.info("Exported the model after step %d to %s", steps_done, run_dir / "hf")
