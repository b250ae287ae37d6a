"""`python -m slime_hydra.report` on small sweeps and a dp=64 plan run, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

VPP_ERROR = (
    "parallel.vpp=2 needs pipeline parallelism, but parallel.pp=1; set parallel.pp to 2 or "
    "more, or parallel.vpp=1."
)


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


def test_report_names_a_failed_sweep_job_with_its_error(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    overrides = ["trainer=plan", "logger=jsonl", "parallel.pp=1", "parallel.vpp=1,2"]
    out = python("-m", "slime_hydra", "-m", *overrides, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = python("-m", "slime_hydra.report", str(sweep), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    good = "0_logger=jsonl,parallel.pp=1,parallel.vpp=1,trainer=plan"
    bad = "1_logger=jsonl,parallel.pp=1,parallel.vpp=2,trainer=plan"
    listing = [
        f"{sweep}: 1 of 2 jobs failed (no metrics.jsonl):",
        f"  {bad}",
        f"    {VPP_ERROR}",
        f"    {sweep / bad}",
    ]
    report = sweep / "report"
    assert out.stdout.splitlines() == [
        str(report / "sweep.png"),
        str(report / f"{good}.png"),
        str(report / "failed_jobs.txt"),
        *listing,
    ]
    assert (report / "failed_jobs.txt").read_text().splitlines() == listing


def test_report_of_a_dp64_plan_run(tmp_path: Path) -> None:
    run = tmp_path / "dp64"
    overrides = [
        "trainer=plan",
        "logger=jsonl",
        "parallel.dp=64",
        "batching.global_batch_size=512",
        "data.num_prompts=128",
    ]
    out = python("-m", "slime_hydra", *overrides, f"hydra.run.dir={run}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = python("-W", "error::UserWarning", "-m", "slime_hydra.report", str(run), cwd=tmp_path)
    assert out.returncode == 0, out.stderr  # e.g. a constrained layout that collapsed
    assert out.stdout.splitlines() == [str(run / "report" / "dp64.png")]
    assert (run / "report" / "dp64.png").stat().st_size > 50_000
