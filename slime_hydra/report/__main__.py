"""`python -m slime_hydra.report RUN_OR_SWEEP_DIR... [--out DIR]`: PNG plots from run dirs."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from slime_hydra.report.plots import plot_run, plot_sweep
from slime_hydra.report.rundir import RunDir, is_run_dir, sweep_jobs


def report(path: Path, out: Path | None = None) -> list[Path]:
    """Plot a run dir (one figure) or a sweep dir (one per job and a comparison of the jobs),
    into `out` (default: `path`/report); return the files written."""
    out = out if out is not None else path / "report"
    if is_run_dir(path):
        out.mkdir(parents=True, exist_ok=True)
        return [plot_run(RunDir.read(path), out / f"{path.name}.png")]
    jobs = sweep_jobs(path)
    if not jobs:
        raise SystemExit(f"{path}: neither a run dir (metrics.jsonl) nor a sweep dir of runs")
    out.mkdir(parents=True, exist_ok=True)
    runs = [RunDir.read(job) for job in jobs]
    written = [plot_sweep(runs, out / "sweep.png", path.name)]
    written += [plot_run(run, out / f"{run.name}.png") for run in runs]
    return written


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the dirs and --out, write the plots, print their paths."""
    parser = argparse.ArgumentParser(prog="python -m slime_hydra.report", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="run dirs or sweep (multirun) dirs")
    parser.add_argument(
        "--out", type=Path, help="write here (one subdir per dir given) instead of DIR/report"
    )
    args = parser.parse_args(argv)
    for path in args.dirs:
        out = args.out / path.resolve().name if args.out is not None else None
        for written in report(path, out):
            print(written)


if __name__ == "__main__":
    sys.exit(main())
