"""Reading a run or sweep dir back (metrics.jsonl, schedule.json, a failed job's error.txt); the
numbers that summarise a run are slime_hydra/log/summary.py's, shared with the wandb sink."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import parse_json, read_text
from slime_hydra.log.jsonl import rows_done
from slime_hydra.log.sink import Metrics
from slime_hydra.log.summary import SUMMARY, run_summary
from slime_hydra.report.panels import plotted_keys
from slime_hydra.rundir import ERROR_FILE, LOCK_FILE, SWEEP_JOBS
from slime_hydra.schedule import Schedule

__all__ = [
    "FailedJob",
    "RunDir",
    "failed_jobs",
    "is_run_dir",
    "job_dirs",
    "read_schedule",
    "run_summary",
    "sweep_jobs",
]

ERROR_BYTES = 65536
"""The most of a failed job's error.txt read for its first line."""

JOB_MARKS = ("metrics.jsonl", ERROR_FILE, LOCK_FILE)
"""Files that make a sweep dir's subdir a job dir: the app takes `.lock` before anything else,
a job that runs writes metrics.jsonl, one that is refused writes error.txt."""


def read_schedule(run_dir: Path) -> Schedule | None:
    """The run dir's schedule.json, or None if it has none; our error if it is damaged."""
    path = run_dir / "schedule.json"
    if not path.exists():
        return None
    fix = "the run's schedule cannot be plotted; restore the file or remove it."
    data = parse_json(read_text(path, "schedule", fix), str(path))
    try:
        return Schedule.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise SlimeHydraError(
            f"{path} is not a schedule ({type(exc).__name__}: {exc}); " + fix
        ) from None


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
        """Read metrics.jsonl and schedule.json of `path`; every metric the report reads must
        be a number or null."""
        file = path / "metrics.jsonl"
        rows = [json.loads(line) for line in rows_done(file, steps_done=2**63 - 1)]
        keys = plotted_keys() | {key for key, _, _ in SUMMARY}
        for row in rows:
            for key in sorted(keys & row.keys()):
                value = row[key]
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, int | float)
                ):
                    raise SlimeHydraError(
                        f"{file}: step {row['step']} logs {key}={value!r}, not a number, and the "
                        "report plots numbers only. Set that value to a number or null, or "
                        "remove the line."
                    )
        return cls(path, rows, read_schedule(path))


@dataclass(frozen=True)
class FailedJob:
    """A sweep job that logged no metrics: its dir and the first line of why."""

    path: Path
    error: str

    @property
    def name(self) -> str:
        """The dir's name: the job number and its overrides."""
        return self.path.name

    @property
    def has_error_file(self) -> bool:
        """Whether the job recorded its error (error.txt) rather than stopping without one."""
        return (self.path / ERROR_FILE).is_file()

    @classmethod
    def read(cls, path: Path) -> FailedJob:
        """The first non-empty line of `path`/error.txt, or a note that the job left none."""
        error_file = path / ERROR_FILE
        if not error_file.is_file():
            note = f"no error.txt: it stopped before logging a step (see the job's log in {path})"
            return cls(path, note)
        with error_file.open("rb") as f:
            text = f.read(ERROR_BYTES).decode(errors="replace")  # its first line is enough
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return cls(path, lines[0] if lines else "error.txt is empty")


def is_run_dir(path: Path) -> bool:
    """A dir that a run wrote metrics to."""
    return (path / "metrics.jsonl").is_file()


def job_ran(path: Path) -> bool:
    """A sweep job that logged metrics and recorded no failure (a job that failed in training
    has metrics and an error.txt)."""
    return is_run_dir(path) and not (path / ERROR_FILE).is_file()


def sweep_outcomes(sweep_dir: Path, offset: int = 0) -> list[tuple[str, bool]]:
    """(job dir relative to the sweep dir, whether it succeeded) of each job that started, from
    the sweep dir's sweep_jobs.jsonl past `offset`, in order of start; an outcome ends the
    earliest unended start in its dir (jobs may share one), and a job that started and never
    ended (its process was killed) failed. A torn or undecodable line (a job killed mid-write)
    is skipped."""
    path = sweep_dir / SWEEP_JOBS
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(offset)
        lines = f.read().splitlines()
    outcomes: list[tuple[str, bool]] = []
    unended: dict[str, list[int]] = {}  # job dir → its starts without an outcome yet
    for line in lines:
        try:
            entry = json.loads(line)
            job = entry["job"]
        except (ValueError, KeyError, TypeError):
            continue
        if "failed" not in entry:
            unended.setdefault(job, []).append(len(outcomes))
            outcomes.append((job, False))
        elif unended.get(job):
            outcomes[unended[job].pop(0)] = (job, entry["failed"] is False)
    return outcomes


def job_number(path: Path, sweep: Path) -> tuple[int, str]:
    """The sort key of a job dir: Hydra's job number (its name's `N_` head), then its path."""
    rel = str(path.relative_to(sweep))
    head = rel.split("_", 1)[0]
    return (int(head) if head.isascii() and head.isdigit() else 1 << 30, rel)


def job_dirs(path: Path, marks: tuple[str, ...] = JOB_MARKS) -> list[Path]:
    """Every job dir under a sweep dir (a dir holding one of `marks`), in job-number order. A
    swept value holding "/" (a data.path) nests the job's dir below the sweep dir, so the dirs
    are searched at any depth, but not inside a job dir."""
    found = []
    for where, dirs, _ in os.walk(path):
        at = Path(where)
        if at != path and any((at / mark).exists() for mark in marks):
            found.append(at)
            dirs.clear()
    return sorted(found, key=lambda p: job_number(p, path))


def sweep_jobs(path: Path, jobs: list[Path] | None = None) -> list[Path]:
    """The run dirs (jobs that logged metrics and recorded no failure) among `jobs` (default:
    every job dir under the sweep dir), in job-number order."""
    return [p for p in (job_dirs(path) if jobs is None else jobs) if job_ran(p)]


def failed_jobs(path: Path, jobs: list[Path] | None = None) -> list[FailedJob]:
    """The jobs among `jobs` (default: every job dir under the sweep dir) that failed: refused
    or failed in training (error.txt), or stopped before their first step, in job-number
    order."""
    return [FailedJob.read(p) for p in (job_dirs(path) if jobs is None else jobs) if not job_ran(p)]
