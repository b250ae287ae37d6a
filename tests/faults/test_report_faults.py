"""`python -m slime_hydra.report` on a dir it cannot plot: one line, exit 1, no traceback; a
torn last line (what a kill leaves) is dropped and the rest is plotted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
