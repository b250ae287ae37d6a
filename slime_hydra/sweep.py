"""The line a multirun ends with: how many jobs ran and how many failed, and where to read why
(registered as a Hydra callback under `hydra.callbacks` in conf/config.yaml)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from slime_hydra.report.rundir import JOB_MARKS, job_dirs, job_ran, sweep_outcomes
from slime_hydra.rundir import ERROR_FILE, LOG_FILE, SWEEP_JOBS, note_sweep_start

MAX_NAMED = 3
"""Failed jobs named one by one in the line; beyond, the line points at the sweep dir."""

JOB_DIR_MARKS = (*JOB_MARKS, LOG_FILE)
"""What a job leaves in its dir however early it stopped: Hydra opens the job's log first."""


def sweep_line(sweep_dir: Path, offset: int = 0, before: set[Path] | None = None) -> str:
    """`sweep: N jobs, F failed (see ...)` for the jobs that reported to the sweep dir's
    sweep_jobs.jsonl past `offset` (where this sweep began): a job that ended failed (refused,
    or failed in training) or never ended (killed) failed; each one's error.txt (or dir, if it
    wrote none) is named. With `before` (the job dirs the sweep dir held when this sweep began),
    a job dir that appeared since without a line (its job stopped before writing it, or could
    not write it) counts too: it succeeded if it logged metrics and recorded no error."""
    if not sweep_dir.is_dir():
        return f"sweep: 0 jobs ({sweep_dir} does not exist)"
    outcomes = sweep_outcomes(sweep_dir, offset)
    if before is not None:
        noted = {job for job, _ in outcomes}
        for job in job_dirs(sweep_dir, JOB_DIR_MARKS):
            rel = os.path.relpath(job, sweep_dir)
            if job not in before and rel not in noted:
                outcomes.append((rel, job_ran(job)))
    failed = list(dict.fromkeys(sweep_dir / job for job, ok in outcomes if not ok))
    head = f"sweep: {len(outcomes)} jobs, {sum(not ok for _, ok in outcomes)} failed"
    if not failed:
        return f"{head} ({sweep_dir})"
    if len(failed) > MAX_NAMED:
        return f"{head} (see {sweep_dir}/*/{ERROR_FILE})"
    where = [job / ERROR_FILE if (job / ERROR_FILE).is_file() else job for job in failed]
    return f"{head} (see {', '.join(map(str, where))})"


class SweepSummary(Callback):
    """Prints sweep_line once every job of a multirun has returned; the launcher (basic,
    joblib, submitit) ran the jobs wherever it did, so the count is read from the sweep dir."""

    running: ClassVar[SweepSummary | None] = None
    """The sweep this process began and has not ended yet (for stopped_line)."""

    def __init__(self) -> None:
        self._sweep_dir = Path()
        self._offset = 0
        self._before: set[Path] = set()

    def line(self) -> str:
        """This sweep's line, from what its sweep dir holds now."""
        return sweep_line(self._sweep_dir, self._offset, self._before)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Note the jobs an earlier sweep left in the sweep dir, and keep its multirun.yaml
        (Hydra would overwrite it with this sweep's) as multirun.K.yaml."""
        sweep_dir = self._sweep_dir = Path(config.hydra.sweep.dir)
        SweepSummary.running = self
        jobs = sweep_dir / SWEEP_JOBS
        self._offset = jobs.stat().st_size if jobs.is_file() else 0
        self._before = set(job_dirs(sweep_dir, JOB_DIR_MARKS)) if sweep_dir.is_dir() else set()
        if sweep_dir.is_dir():  # each job checks its dir against this sweep's jobs only
            note_sweep_start(sweep_dir)
        old = sweep_dir / "multirun.yaml"
        if old.is_file() and not old.is_symlink():
            k = 1
            while os.path.lexists(sweep_dir / f"multirun.{k}.yaml"):
                k += 1
            os.rename(old, sweep_dir / f"multirun.{k}.yaml")
            print(
                f"sweep: {sweep_dir} held an earlier sweep; its multirun.yaml is now "
                f"multirun.{k}.yaml",
                flush=True,
            )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Print the count line (stdout: after the jobs, logging is the last job's)."""
        SweepSummary.running = None
        print(self.line(), flush=True)


def stopped_line(why: str) -> str | None:
    """The line of a sweep this process began that stopped before its end (`why`: the signal or
    exit status), counting the jobs its dir holds; None where no sweep is under way."""
    summary, SweepSummary.running = SweepSummary.running, None
    return None if summary is None else f"{summary.line()}; it stopped before its end ({why})"
