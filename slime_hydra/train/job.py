"""Job: everything a trainer needs, planned once by the app before training starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.log.sink import RunInfo, Sink
from slime_hydra.schedule import BatchingStrategy, ParallelLayout, Schedule, step_metrics
from slime_hydra.schedule.cost import ModelDims, flops_coefficients
from slime_hydra.schedule.steptime import StepCost, StepTiming, simulate_flat

if TYPE_CHECKING:  # the packer imports torch; the app and --help do not need it
    from slime_hydra.data.iterator import MicrobatchIterator


@dataclass(frozen=True)
class PlannedStep:
    """What the plan says of one scheduled step before it runs: its batch/* metrics
    (schedule.step_metrics) and its time predicted by the step cost model."""

    metrics: dict[str, float | int | None]
    timing: StepTiming


def plan_steps(
    schedule: Schedule, layout: ParallelLayout, dims: ModelDims, cost: StepCost
) -> tuple[PlannedStep, ...]:
    """Every step's PlannedStep, computed once when the job is made: plan mode and the step
    loop read them as plain values instead of going back to the schedule's code mid-run."""
    lengths, coefficients = schedule.lengths, flops_coefficients(dims)
    every = np.asarray(lengths, dtype=np.int64)
    planned = []
    for step in schedule.steps:
        counts, samples = step.flat()
        planned.append(
            PlannedStep(
                step_metrics(step, lengths, schedule.cap, layout, coefficients),
                simulate_flat(every[samples], counts, step.mbs_per_rank, layout, cost),
            )
        )
    return tuple(planned)


@dataclass(frozen=True)
class Job:
    """What a trainer and its workers get, typed and frozen (no config tree to parse again):
    the run's identity and dir, the layout and strategy, the rollout and its schedule with each
    step's planned metrics and time, the model's dims, the seed, the tokenizer the rollout came
    from, and the factories of the micro-batch iterator and the logger (their groups,
    instantiated partially)."""

    run: RunInfo
    layout: ParallelLayout
    strategy: BatchingStrategy
    rollout: RolloutBatch
    schedule: Schedule
    dims: ModelDims
    seed: int
    iterator: Callable[..., MicrobatchIterator]
    logger: Callable[..., Sink]
    cost: StepCost
    """The step cost model (schedule/steptime.py): trainer.cost's calibration, or analytic."""
    planned: tuple[PlannedStep, ...]
    """plan_steps of the schedule: each step's batch/* metrics and predicted time."""
    tokenizer: str | None = None

    @property
    def flops_coefficients(self) -> tuple[float, float]:
        """(a, b) of the cost a·L + b·L² of a sequence of L tokens under this model."""
        return flops_coefficients(self.dims)
