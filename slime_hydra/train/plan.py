"""trainer=plan: simulate any cluster layout in one process; metrics come from the schedule."""

from __future__ import annotations

from slime_hydra.config import open_sinks
from slime_hydra.train.job import Job


class PlanTrainer:
    """Logs every step's schedule metrics without building a model."""

    def run(self, job: Job) -> None:
        """Emit one metrics row per planned step to metrics.jsonl and the logger."""
        sink = open_sinks(job.cfg, job.run)
        try:
            for step in job.schedule.steps:
                sink.log({"step": step.step, **job.batch_metrics(step.step)})
        finally:
            sink.close()
