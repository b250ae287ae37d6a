"""trainer=plan: simulate any cluster layout in one process, from the schedule, a cost model and
a memory model."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

from slime_hydra.log.sink import NoSink
from slime_hydra.log.sinks import open_sinks
from slime_hydra.schedule import StepSchedule
from slime_hydra.schedule.memory import GIB, MemoryModel
from slime_hydra.schedule.schedule import step_number
from slime_hydra.train.job import Job
from slime_hydra.train.run.checks import check_knobs
from slime_hydra.train.run.torchrun import is_rank_zero
from slime_hydra.train.settings import PlanTrainer

log = logging.getLogger(__name__)


def check_plan(trainer: PlanTrainer) -> None:
    """Plan mode simulates any layout and measures any schedule; only its cost model's
    numbers must make sense (a zero or negative speed would divide by zero or go back)."""
    check_knobs(
        "trainer",
        achieved_tflops=(trainer.achieved_tflops, 1e-3, None),
        microbatch_overhead_ms=(trainer.microbatch_overhead_ms, 0.0, None),
        memory_limit_gib=(trainer.memory_limit_gib, 1e-3, None),
    )


def run_plan(trainer: PlanTrainer, job: Job) -> float:
    """Emit one metrics row per planned step to metrics.jsonl, the logger and the console
    table (plan mode's output, whatever the logger); return the simulated seconds of all
    steps (the sweep objective), +inf if a micro-batch breaks the cap or is empty or a step
    needs more than trainer.memory_limit_gib per GPU. Under torchrun only rank 0 logs: it
    owns (and has locked) the run dir, so no other rank writes into it."""
    rows = simulated_rows(trainer, job)
    sink = open_sinks(job.logger, job.run, job.schedule, table=True) if is_rank_zero() else NoSink()
    total = 0.0
    try:
        for metrics in rows:
            sink.log(metrics)
            broken = metrics["batch/cap_violations"] or metrics["batch/empty_microbatches"]
            total += math.inf if broken else metrics["sim/step_s"]
            total += memory_penalty(trainer, metrics["step"], metrics["sim/peak_memory_gib"])
    finally:
        sink.close()
    return total


def simulated_rows(trainer: PlanTrainer, job: Job) -> Iterator[dict[str, float | int | None]]:
    """Each step's row, simulated as it is logged: its number, the plan's batch/* metrics
    (job.planned) and the sim/* metrics of `simulate`."""
    for step in job.schedule.steps:
        sim = simulate(trainer, job, step)
        yield {"step": step_number(step.step), **job.planned[step.step].metrics, **sim}


def memory_penalty(trainer: PlanTrainer, step: int, peak_gib: float) -> float:
    """+inf for a step over trainer.memory_limit_gib (it would run out of memory), with a
    warning that says what lowers it; else 0. +inf, not NaN: the optuna sweeper ranks +inf
    last and stops the sweep on NaN (hydra issue #2237)."""
    if trainer.memory_limit_gib is None or peak_gib <= trainer.memory_limit_gib:
        return 0.0
    log.warning(
        "Step %d needs %.1f GiB per GPU, over trainer.memory_limit_gib=%s, so the run's "
        "objective is +inf. Lower batching.max_tokens_per_gpu, raise parallel.tp/pp/cp, set "
        "trainer.use_distributed_optimizer=true, or trainer.memory_limit_gib=null.",
        step,
        peak_gib,
        trainer.memory_limit_gib,
    )
    return math.inf


def simulate(trainer: PlanTrainer, job: Job, step: StepSchedule) -> dict[str, float | int]:
    """sim/* metrics: the step time of megatron's schedule under the job's cost model
    (job.planned: schedule/steptime.py's slowest DP rank's pipeline, then the all-reduce and
    optimizer), the idle share of all pipeline stages of all DP ranks, the peak micro-batch
    tokens per GPU, and the peak memory of the fullest GPU (schedule/memory.py) for the job's
    model."""
    layout, timing = job.layout, job.planned[step.step].timing
    memory = MemoryModel(job.dims, layout, trainer.use_distributed_optimizer)
    tokens = step.microbatch_tokens(job.schedule.lengths)
    peak = max(t for rank in tokens for t in rank)
    return {
        "sim/step_s": timing.step_s,
        "sim/bubble_frac": timing.bubble_frac,
        "sim/peak_tokens": peak // layout.cp,
        "sim/slowest_dp_rank": timing.slowest_rank,
        "sim/peak_memory_gib": max(memory.peak_bytes(rank) for rank in tokens) / GIB,
    }
