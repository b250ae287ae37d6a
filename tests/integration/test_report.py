"""`python -m slime_hydra.report` on a small sweep, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in `cwd`, output captured."""
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_report_of_a_small_sweep_writes_non_empty_pngs(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    overrides = ["trainer=plan", "logger=jsonl", "batching=dynamic,slime_1848", "parallel.dp=4"]
    out = python("-m", "slime_hydra", "-m", *overrides, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = python(
        "-m", "slime_hydra.report", str(sweep), "--out", str(tmp_path / "plots"), cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    written = [Path(line) for line in out.stdout.splitlines()]
    assert [p.parent for p in written] == [tmp_path / "plots" / "sweep"] * 3
    assert written[0].name == "sweep.png"
    assert [p.name.split(",")[0] for p in written[1:]] == [
        "0_batching=dynamic",
        "1_batching=slime_1848",
    ]
    for png in written:
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 20_000
