"""Warm-up before the first step: forward and backward of each rank's largest micro-batch.

Memory grows to a step's needs the first time a micro-batch that large runs: on CPU glibc's heap
grows and the kernel faults in (and zeroes) every new page, on GPU the caching allocator calls
cudaMalloc. Measured on dp2 (2026-12-04, docs/cost_model.md): the first step whose micro-batches
were larger than any before (four of 6.9k tokens after 4.4k) took 7.35 s, and 6.04-6.23 s when
run again; a run's later step paid it, so a batching with larger micro-batches late in the
rollout measured 3% slower than one without. Running the largest micro-batch once before step 1
pays it there, and an out-of-memory error comes before any step. The update is untouched: the
next step zeroes the gradients before its own forward (engine.forward_backward), and nothing
else (optimizer, scheduler, random streams: the model has no dropout) moves.
"""

from __future__ import annotations

import logging
import time

from slime_hydra.schedule import ParallelLayout, Schedule, StepSchedule
from slime_hydra.train.job import Job
from slime_hydra.train.run.loop import rank_microbatches
from slime_hydra.train.step.engine import MegatronEngine

log = logging.getLogger(__name__)


def warmup_step(schedule: Schedule, layout: ParallelLayout, first: int, stop: int) -> StepSchedule:
    """A step whose DP rank r runs rank r's largest micro-batch (by tokens) of the steps this
    run trains (indices `first` to `stop` - 1), as many times as the VPP group takes
    (megatron's interleaved schedule needs a multiple)."""
    lengths = schedule.lengths
    steps = schedule.steps[first:stop]
    ranks = []
    for rank in range(layout.dp):
        largest = max(
            (mb for step in steps for mb in step.ranks[rank]),
            key=lambda mb: sum(lengths[i] for i in mb),
        )
        ranks.append([largest] * layout.microbatch_alignment)
    return StepSchedule.build(first, ranks)


def warm_up(engine: MegatronEngine, job: Job, first: int, stop: int) -> None:
    """Run `warmup_step` forward and backward on this rank (every rank takes part: the
    gradient all-reduce is collective) and log its tokens and seconds."""
    step = warmup_step(job.schedule, job.layout, first, stop)
    tic = time.perf_counter()
    engine.forward_backward(rank_microbatches(job.iterator, job.rollout, step))
    tokens = max(rank[0] for rank in step.microbatch_tokens(job.schedule.lengths))
    log.info(
        "warm-up: forward and backward of the largest micro-batch (%d tokens) in %.2f s; "
        "trainer.warmup=false skips it",
        tokens,
        time.perf_counter() - tic,
    )
