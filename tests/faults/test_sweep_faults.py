"""A sweep job that raises something other than our error fails alone: its error.txt names the
exception, the sweep goes on (basic and joblib launchers) and its line counts it as failed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("launcher", ["basic", "local_parallel"])
def test_a_job_raising_a_foreign_exception_fails_alone(tmp_path, launcher):
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [
        sys.executable,
        "-W",
        "ignore",
        "-m",
        "slime_hydra",
        "-m",
        f"hydra/launcher={launcher}",
        "trainer=plan",
        "logger=jsonl",
        "logger._target_=tests.faults.broken.BrokenSink",
        "seed=1,2,3",
        f"hydra.sweep.dir={tmp_path}",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    (bad,) = [p for p in tmp_path.iterdir() if p.name.startswith("1_")]
    error = (bad / "error.txt").read_text()
    assert error.startswith("RuntimeError: the logger's service is down (the traceback is in ")
    # It wrote no step, so its run files are gone again: a fixed rerun may take the dir.
    assert not (bad / "config.yaml").exists() and not (bad / "schedule.json").exists()
    line = out.stdout.splitlines()[-1]
    assert line == f"sweep: 3 jobs, 1 failed (see {bad / 'error.txt'})"
    good = [p for p in tmp_path.iterdir() if p.name[:2] in ("0_", "2_")]
    assert len(good) == 2 and all((p / "metrics.jsonl").is_file() for p in good)
