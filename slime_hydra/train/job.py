"""Job: everything a trainer needs, planned once by the app before training starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.log.sink import RunInfo
from slime_hydra.schedule import BatchingStrategy, ParallelLayout, Schedule, step_metrics

if TYPE_CHECKING:  # the packer imports torch; the app and --help do not need it
    from slime_hydra.data.iterator import MicrobatchIterator


@dataclass(frozen=True)
class Job:
    """The config, the run's identity and dir, the rollout and its schedule, the FLOPs model,
    and the micro-batch iterator's factory (the `iterator` group, instantiated partially)."""

    cfg: DictConfig
    run: RunInfo
    layout: ParallelLayout
    strategy: BatchingStrategy
    rollout: RolloutBatch
    schedule: Schedule
    flops_coefficients: tuple[float, float]
    iterator: Callable[..., MicrobatchIterator]

    def batch_metrics(self, index: int) -> dict[str, float | int | None]:
        """The batch/* metrics of the schedule's step `index` (0-based)."""
        return step_metrics(
            self.schedule.steps[index],
            self.schedule.lengths,
            self.schedule.cap,
            self.layout,
            self.flops_coefficients,
        )
