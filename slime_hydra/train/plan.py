"""trainer=plan: simulate any cluster layout in one process; metrics come from the schedule."""

from __future__ import annotations

from slime_hydra.log.sink import Sink
from slime_hydra.train.job import Job


class PlanTrainer:
    """Logs every step's schedule metrics without building a model."""

    def run(self, job: Job, sink: Sink) -> None:
        """Emit one metrics row per planned step."""
        for step in job.schedule.steps:
            sink.log({"step": step.step, **job.batch_metrics(step.step)})
