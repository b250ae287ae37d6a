"""`python -m slime_hydra.report RUN_OR_SWEEP_DIR... [--out DIR]`: PNG plots from run dirs; a
sweep's failed jobs (no metrics) are printed and listed in failed_jobs.txt beside its plots."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slime_hydra.errors import SlimeHydraError, Stopped, raise_stopped
from slime_hydra.files import make_dirs, write_file
from slime_hydra.report.plots import plot_run, plot_sweep
from slime_hydra.report.rundir import FailedJob, RunDir, failed_jobs, is_run_dir, sweep_jobs

FAILED_FILE = "failed_jobs.txt"


@dataclass(frozen=True)
class Report:
    """What a report wrote, and the sweep jobs it has no metrics to plot for."""

    written: list[Path]
    failed: list[FailedJob] = field(default_factory=list)
    jobs: int = 1
    """Jobs found (a run dir is one)."""


def failed_text(sweep: Path, failed: Sequence[FailedJob], jobs: int) -> str:
    """The failed jobs of a sweep of `jobs` jobs: a count, then per job its name, the first
    line of its error and its dir."""
    lines = [f"{sweep}: {len(failed)} of {jobs} jobs failed (no metrics.jsonl):"]
    for job in failed:
        lines += [f"  {job.name}", f"    {job.error}", f"    {job.path}"]
    return "\n".join(lines) + "\n"


def report(path: Path, out: Path | None = None) -> Report:
    """Plot a run dir (one figure) or a sweep dir (a comparison of its jobs and one figure per
    job that logged metrics, plus failed_jobs.txt when some did not) into `out` (default:
    `path`/report)."""
    out = out if out is not None else path / "report"
    if is_run_dir(path):
        run = RunDir.read(path)
        make_dirs(out, out.parent, "--out")
        return Report([plot_run(run, out / f"{path.name}.png")])
    jobs, failed = sweep_jobs(path), failed_jobs(path)
    if not jobs and not failed:
        raise SystemExit(f"{path}: neither a run dir (metrics.jsonl) nor a sweep dir of runs")
    runs = [RunDir.read(job) for job in jobs]
    make_dirs(out, out.parent, "--out")
    written = [plot_sweep(runs, out / "sweep.png", path.name, failed)] if runs else []
    written += [plot_run(run, out / f"{run.name}.png") for run in runs]
    if failed:
        text = failed_text(path, failed, len(jobs) + len(failed))
        write_file(out / FAILED_FILE, text, out)
        written.append(out / FAILED_FILE)
    return Report(written, failed, len(jobs) + len(failed))


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the dirs and --out, write the plots, print their paths, then each sweep's failed
    jobs (as in failed_jobs.txt). SIGINT/SIGTERM stop it with one line, exit 130/143."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, raise_stopped)
    try:
        _main(argv)
    except Stopped as exc:
        print(
            f"report stopped by {exc.name}: each figure it wrote is complete, the one being drawn "
            "was not written (no partial or temporary file is left).",
            file=sys.stderr,
        )
        sys.exit(128 + exc.signum)


def _main(argv: Sequence[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slime_hydra.report", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs or sweep (multirun) dirs")
    parser.add_argument(
        "--out", type=Path, help="write here (one subdir per dir given) instead of DIR/report"
    )
    args = parser.parse_args(argv)
    for path in args.dirs:
        if not path.is_dir():
            what = "does not exist" if not path.exists() else "is not a directory"
            raise SystemExit(f"{path} {what}: give a run dir or a sweep (multirun) dir.")
        out = args.out / path.resolve().name if args.out is not None else None
        try:
            done = report(path, out)
        except SlimeHydraError as exc:
            raise SystemExit(str(exc)) from None
        except OSError as exc:
            raise SystemExit(
                f"the report of {path} cannot be written to {exc.filename or out}: "
                f"{exc.strerror or exc}. Pass --out DIR to write it elsewhere."
            ) from None
        for written in done.written:
            print(written)
        if done.failed:
            print(failed_text(path, done.failed, done.jobs), end="")


if __name__ == "__main__":
    sys.exit(main())
