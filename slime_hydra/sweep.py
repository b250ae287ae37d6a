"""The line a multirun ends with: how many jobs ran and how many failed, and where to read why
(registered as a Hydra callback under `hydra.callbacks` in conf/config.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from slime_hydra.report.rundir import failed_jobs, sweep_jobs
from slime_hydra.rundir import ERROR_FILE

MAX_NAMED = 3
"""Failed jobs named one by one in the line; beyond, the line points at the sweep dir."""


def sweep_line(sweep_dir: Path) -> str:
    """`sweep: N jobs, F failed (see ...)` for the job dirs under `sweep_dir`: a job that
    logged no metrics failed; each one's error.txt (or dir, if it wrote none) is named."""
    if not sweep_dir.is_dir():
        return f"sweep: 0 jobs ({sweep_dir} does not exist)"
    ran, failed = sweep_jobs(sweep_dir), failed_jobs(sweep_dir)
    head = f"sweep: {len(ran) + len(failed)} jobs, {len(failed)} failed"
    if not failed:
        return f"{head} ({sweep_dir})"
    if len(failed) > MAX_NAMED:
        return f"{head} (see {sweep_dir}/*/{ERROR_FILE})"
    where = [job.path / ERROR_FILE if job.has_error_file else job.path for job in failed]
    return f"{head} (see {', '.join(map(str, where))})"


class SweepSummary(Callback):
    """Prints sweep_line once every job of a multirun has returned; the launcher (basic,
    joblib, submitit) ran the jobs wherever it did, so the count is read from the sweep dir."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Print the count line (stdout: after the jobs, logging is the last job's)."""
        print(sweep_line(Path(config.hydra.sweep.dir)), flush=True)
