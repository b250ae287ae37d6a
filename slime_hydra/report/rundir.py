"""Reading a run dir back (metrics.jsonl, schedule.json) and the numbers that summarise a run.

No plotting here, so the wandb sink can use the same summary without importing matplotlib.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime_hydra.schedule import Schedule

Metrics = dict[str, Any]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


SUMMARY: tuple[tuple[str, str, Callable[[Sequence[float]], float]], ...] = (
    ("batch/cap_violations", "cap_violations_max", max),
    ("batch/cap_violations", "cap_violations_total", sum),
    ("batch/empty_microbatches", "empty_microbatches_total", sum),
    ("batch/oversize_samples", "oversize_samples_total", sum),
    ("batch/mb_tokens_max", "mb_tokens_max", max),
    ("batch/token_imbalance", "token_imbalance_mean", _mean),
    ("batch/dp_token_imbalance", "dp_token_imbalance_mean", _mean),
    ("batch/num_microbatches", "num_microbatches_mean", _mean),
    ("batch/num_microbatches_lb", "num_microbatches_lb_mean", _mean),
)
"""(metric key, summary name, reduction over steps) of every summary number."""


def run_summary(rows: Sequence[Metrics]) -> dict[str, float]:
    """Whole-run numbers from per-step metrics: worst cap violation, mean imbalance, totals."""
    summary: dict[str, float] = {"steps": len(rows)}
    for key, name, reduce in SUMMARY:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            summary[name] = reduce(values)
    return summary


def microbatch_tokens(schedule: Schedule, step: int) -> list[list[int]]:
    """Tokens of each micro-batch of each DP rank at `step`: `tokens[rank][microbatch]`."""
    lengths = schedule.lengths
    return [[sum(lengths[i] for i in mb) for mb in rank] for rank in schedule.steps[step].ranks]


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
