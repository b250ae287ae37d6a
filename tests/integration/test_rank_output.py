"""What a 2-rank CPU run prints: rank 0's progress once, in the output and the run dir's log,
each third-party warning once per run, nothing from rank 1 (it has no error)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_train_cpu import REPO, SMALL

pytestmark = pytest.mark.integration

WARNING = "[py.warnings][WARNING] - "


def test_two_ranks_print_rank_0s_progress_once_and_each_warning_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # no -W: our filters
    proc = subprocess.run(
        [sys.executable, "-m", "slime_hydra", f"hydra.run.dir={tmp_path}", *SMALL],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    log = (tmp_path / "slime_hydra.log").read_text()
    for k in range(1, 5):  # 4 steps: each progress line once, in the output and the log
        assert out.count(f"step {k}/4 ") == 1, out[-6000:]
        assert log.count(f"[rank 0][slime_hydra.train.run.loop][INFO] - step {k}/4 ") == 1
    assert "[rank 1]" not in out and "[rank 1]" not in log
    shown = [line.split(WARNING, 1)[1] for line in out.splitlines() if WARNING in line]
    assert shown and len(shown) == len(set(shown))  # every warning once per run
    # megatron warns about each of these at two or more import sites, in every process.
    apex = importlib.util.find_spec("apex") is not None
    te = importlib.util.find_spec("transformer_engine") is not None
    assert out.count("Apex is not installed. Falling back to Torch Norm") == (0 if apex else 1)
    optimizers = "Transformer Engine and Apex are not installed. Falling back to Torch optimizers"
    assert out.count(optimizers) == (0 if apex or te else 1)
    assert "Params for bucket" not in out  # megatron's INFO set-up chatter
