"""Batching must not change the math: one step's gradients under dynamic batching, fixed
batching, one sample per micro-batch, and dp=1 vs dp=2, through the CPU trainer's functions."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_grad_worker.py")


def _gradients(tmp_path: Path, nproc: int) -> dict[str, Any]:
    """Run the worker on nproc gloo ranks (dp = nproc); rank 0's gradients per batching."""
    out = tmp_path / f"dp{nproc}.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-W",
        "ignore",
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(WORKER),
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return torch.load(out)


@pytest.mark.integration
def test_step_gradients_do_not_depend_on_batching_or_dp(tmp_path: Path) -> None:
    dp1, dp2 = _gradients(tmp_path, 1), _gradients(tmp_path, 2)
    reference = dp1["grads"]["one_per_mb"]
    assert reference.abs().sum() > 0
    # The batchings really differ: 16 micro-batches of one sample vs a few packed ones.
    assert dp1["num_microbatches"]["one_per_mb"] == 16
    assert len(set(dp1["num_microbatches"].values())) == 3, dp1["num_microbatches"]
    assert dp2["num_microbatches"]["one_per_mb"] == 8
    for run in (dp1, dp2):
        for name, grad in run["grads"].items():
            torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-7, msg=name)
