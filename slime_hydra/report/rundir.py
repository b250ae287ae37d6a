"""Reading a run dir back (metrics.jsonl, schedule.json); the numbers that summarise a run are
slime_hydra/log/summary.py's, shared with the wandb sink."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from slime_hydra.log.sink import Metrics
from slime_hydra.log.summary import run_summary
from slime_hydra.schedule import Schedule

__all__ = ["RunDir", "is_run_dir", "read_schedule", "run_summary", "sweep_jobs"]


def read_schedule(run_dir: Path) -> Schedule | None:
    """The run dir's schedule.json, or None if it has none."""
    path = run_dir / "schedule.json"
    return Schedule.from_json(json.loads(path.read_text())) if path.exists() else None


@dataclass(frozen=True)
class RunDir:
    """One run dir read back: its name, per-step metrics and schedule."""

    path: Path
    metrics: list[Metrics]
    schedule: Schedule | None

    @property
    def name(self) -> str:
        """The dir's name (in a sweep: the job number and its overrides)."""
        return self.path.name

    @classmethod
    def read(cls, path: Path) -> RunDir:
        """Read metrics.jsonl and schedule.json of `path`."""
        lines = (path / "metrics.jsonl").read_text().splitlines()
        return cls(path, [json.loads(line) for line in lines if line], read_schedule(path))


def is_run_dir(path: Path) -> bool:
    """A dir that a run wrote metrics to."""
    return (path / "metrics.jsonl").is_file()


def sweep_jobs(path: Path) -> list[Path]:
    """The run dirs directly under a sweep dir, in job-number order."""

    def job_number(p: Path) -> tuple[int, str]:
        head = p.name.split("_", 1)[0]
        return (int(head) if head.isdigit() else 1 << 30, p.name)

    return sorted((p for p in path.iterdir() if is_run_dir(p)), key=job_number)
