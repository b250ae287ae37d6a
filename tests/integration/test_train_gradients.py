"""Batching must not change the math: one step's gradients under dynamic batching, fixed
batching, one sample per micro-batch, and dp=1 vs dp=2, through the CPU trainer's functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.torchrun import run_torchrun

WORKER = Path(__file__).with_name("_grad_worker.py")


def _gradients(tmp_path: Path, nproc: int) -> dict[str, Any]:
    """Run the worker on nproc gloo ranks (dp = nproc); rank 0's gradients per batching."""
    return run_torchrun(WORKER, nproc, tmp_path / f"dp{nproc}.pt")


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
