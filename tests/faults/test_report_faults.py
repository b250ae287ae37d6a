"""`python -m slime_hydra.report` on a dir it cannot plot: one line, exit 1, no traceback; a
torn last line (what a kill leaves) is dropped and the rest is plotted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slime_hydra.report.plots import run_figure
from slime_hydra.report.rundir import RunDir

REPO = Path(__file__).resolve().parents[2]
ROW = {"step": 1, "train/loss": 1.0}


def report(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra.report", str(path)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def run_dir(tmp_path: Path, metrics: bytes) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_bytes(metrics)
    return d


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda t: t / "missing", "missing does not exist: give a run dir or a sweep"),
        (lambda t: (t / "f").write_text("x") and t / "f", "f is not a directory"),
        (
            lambda t: run_dir(t, b'{"step": 1, "train/lo\n' + json.dumps(ROW).encode() + b"\n"),
            "metrics.jsonl:1: not a metrics row",
        ),
        (
            lambda t: run_dir(t, b'{"st\xffep": 1}\n' + json.dumps(ROW).encode() + b"\n"),
            "metrics.jsonl:1: not a metrics row (byte 0xff at column 5 is not UTF-8)",
        ),
    ],
)
def test_a_dir_the_report_cannot_read_is_one_line(tmp_path, make, needle):
    out = report(make(tmp_path))
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.integration
def test_a_torn_last_line_is_dropped_and_the_rest_plotted(tmp_path):
    d = tmp_path / "run"
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", "trainer=plan", "logger=jsonl"]
    planned = subprocess.run([*cmd, f"hydra.run.dir={d}"], cwd=REPO, capture_output=True)
    assert planned.returncode == 0
    metrics = d / "metrics.jsonl"
    metrics.write_bytes(metrics.read_bytes() + '{"step": 5, "train/lé'.encode()[:-1])  # mid-é
    out = report(d)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "torn last line" in out.stderr
    assert (d / "report" / "run.png").stat().st_size > 0
    assert "metrics.jsonl:5: dropping a torn last line" in out.stderr


def rows(*metrics: dict) -> bytes:
    return b"".join(json.dumps({"step": i, **m}).encode() + b"\n" for i, m in enumerate(metrics, 1))


def test_rows_without_the_batch_metrics_plot_what_they_log(tmp_path):
    """A hand-written metrics.jsonl (no schedule.json, no batch/*): the panels of its metrics."""
    d = run_dir(tmp_path, rows({"train/loss": 1.0}, {"train/loss": 0.5, "perf/tokens_per_s": 9}))
    out = report(d)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert out.stdout.strip() == str(d / "report" / "run.png")
    figure = run_figure(RunDir.read(d))
    assert [ax.get_title() for ax in figure.axes] == ["Training loss", "Throughput"]


def test_a_sweep_of_runs_without_the_batch_metrics_compares_what_they_log(tmp_path):
    for job, loss in (("0_seed=1", 1.0), ("1_seed=2", 0.5)):
        (tmp_path / job).mkdir()
        (tmp_path / job / "metrics.jsonl").write_bytes(rows({"train/loss": loss}))
    out = report(tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "report" / "sweep.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("metrics", "needle"),
    [
        (rows({}, {"note": "hand-written"}), "logs none of the metrics the report plots ("),
        (
            rows({"train/loss": 1.0}, {"batch/num_microbatches": "four"}),
            "metrics.jsonl: step 2 logs batch/num_microbatches='four', not a number",
        ),
        (rows({"train/loss": True}), "step 1 logs train/loss=True, not a number"),
        (rows({"perf/tokens_per_s": [1, 2]}), "logs perf/tokens_per_s=[1, 2], not a number"),
    ],
)
def test_rows_the_report_cannot_plot_are_one_line(tmp_path, metrics, needle):
    out = report(run_dir(tmp_path, metrics))
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_non_finite_values_are_plotted_without_an_axis_error(tmp_path):
    d = run_dir(tmp_path, rows({"perf/tokens_per_s": float("inf")}, {"perf/tokens_per_s": 3.0}))
    out = report(d)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (d / "report" / "run.png").stat().st_size > 0


def test_the_report_never_writes_through_a_planted_link(tmp_path):
    d = run_dir(tmp_path, rows({"train/loss": 1.0}))
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "png").write_text("the user's file\n")
    (d / "report").mkdir()
    (d / "report" / "run.png").symlink_to(outside / "png")
    out = report(d)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (outside / "png").read_text() == "the user's file\n"  # the link was replaced
    assert not (d / "report" / "run.png").is_symlink()
    shutil.rmtree(d / "report")
    (d / "report").symlink_to(outside / "dir")
    out = report(d)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"{d / 'report'} is a symlink" in out.stderr
    assert "or pass a new --out." in out.stderr  # the report's own option, not hydra.run.dir
    assert os.listdir(outside / "dir") == []


def test_a_report_out_dir_under_a_file_is_one_line(tmp_path):
    d = run_dir(tmp_path, rows({"train/loss": 1.0}))
    (tmp_path / "file").write_text("x")
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra.report", str(d)]
    out = subprocess.run(
        [*cmd, "--out", str(tmp_path / "file")], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"{tmp_path / 'file'} is a file where a dir is needed ({tmp_path / 'file'}" in out.stderr
    assert "pass a new --out." in out.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_report_stopped_by_a_signal_is_one_line_and_leaves_whole_figures(tmp_path, sig):
    # 200 jobs: ~20 s of figures after sweep.png, so a loaded machine that delays this poll by
    # seconds still signals a report in progress (with 40, CI once saw it end first, exit 0).
    jobs = 200
    for job in range(jobs):
        (tmp_path / f"{job}_seed={job}").mkdir()
        (tmp_path / f"{job}_seed={job}" / "metrics.jsonl").write_bytes(
            rows({"train/loss": 1.0}, {"train/loss": 0.5 + job})
        )
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra.report", str(tmp_path)]
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    report_dir = tmp_path / "report"
    deadline = time.monotonic() + 120
    while not (report_dir / "sweep.png").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert f"report stopped by {sig.name}: each figure it wrote is complete" in err
    names = os.listdir(report_dir)
    assert "sweep.png" in names and len(names) < jobs + 1, names  # stopped before the last
    assert all(n.endswith(".png") and not n.startswith(".") for n in names), names


def schedule(lengths: object = (3, 5), ranks: object = (((0, 1),),), cap: object = None) -> dict:
    return {"lengths": list(lengths), "cap": cap, "steps": [{"step": 1, "ranks": ranks}]}


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (schedule(lengths=(1e400, 2)), "lengths must be a list of non-negative integers"),
        (schedule(ranks=[]), "step 1: ranks must be a non-empty list of lists"),
        (schedule(ranks=[[[0, 7]]]), "step 1: sample 7 is not an index of lengths"),
        (schedule(cap=True), "cap=True is not a positive integer or null"),
    ],
    ids=["infinite_length", "no_ranks", "index_out_of_range", "bool_cap"],
)
def test_a_hand_edited_schedule_is_one_line(tmp_path, doc, needle):
    """A float length reached matplotlib ('Axis limits cannot be NaN or Inf') and a step
    without ranks a ZeroDivisionError."""
    d = run_dir(tmp_path, rows({"batch/num_microbatches": 1}))
    (d / "schedule.json").write_text(json.dumps(doc))
    out = report(d)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and needle in out.stderr, out.stderr[-3000:]
    assert "schedule.json is not a schedule (ValueError: " in out.stderr
