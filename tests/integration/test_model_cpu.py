"""The megatron-core GPTModel on CPU (gloo): packed attention, tensor parallelism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.torchrun import run_torchrun

WORKER = Path(__file__).with_name("_model_worker.py")
SEQ_SPANS = [(0, 5), (5, 14), (14, 17)]  # the worker's packed sequences of lengths 5, 9, 3


def _run_worker(tmp_path: Path, nproc: int, tp: int) -> dict[str, Any]:
    """Run the worker under torchrun with nproc gloo ranks and return rank 0's results."""
    return run_torchrun(WORKER, nproc, tmp_path / f"tp{tp}.pt", str(tp))


@pytest.fixture(scope="module")
def tp1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Results of the worker on one gloo rank, tp=1."""
    return _run_worker(tmp_path_factory.mktemp("tp1"), nproc=1, tp=1)


@pytest.mark.integration
def test_forward_backward_on_packed_batch(tp1: dict[str, Any]) -> None:
    assert tp1["logits"].shape == (17, 256)
    assert torch.isfinite(tp1["logits"]).all()
    assert torch.isfinite(torch.tensor(tp1["loss"]))
    assert tp1["num_tokens"] == 17 - 3
    assert tp1["num_params_without_grad"] == 0
    assert tp1["grad_norm"] > 0


@pytest.mark.integration
def test_attention_stays_inside_each_packed_sequence(tp1: dict[str, Any]) -> None:
    first, rest = slice(*SEQ_SPANS[0]), slice(SEQ_SPANS[1][0], None)
    # Changing sequence 1's tokens changes its logits but not those of sequences 2 and 3 ...
    assert not torch.allclose(tp1["logits_perturbed"][first], tp1["logits"][first])
    torch.testing.assert_close(tp1["logits_perturbed"][rest], tp1["logits"][rest])
    # ... and sequence 2 packed behind another gives its logits alone (positions restart too).
    torch.testing.assert_close(tp1["logits_alone"], tp1["logits"][slice(*SEQ_SPANS[1])])
    # The unpacked (SBHD, no PackedSeqParams) path is the same causal attention.
    torch.testing.assert_close(tp1["logits_unpacked"], tp1["logits_alone"])


@pytest.mark.integration
def test_tensor_parallel_matches_single_rank(tp1: dict[str, Any], tmp_path: Path) -> None:
    tp2 = _run_worker(tmp_path, nproc=2, tp=2)
    assert tp2["losses_per_rank"][0] == tp2["losses_per_rank"][1]
    # Same seed → same master weights, split across the 2 ranks: the same function as tp=1.
    for key in ("logits", "logits_perturbed", "logits_alone", "logits_unpacked"):
        torch.testing.assert_close(tp2[key], tp1[key], rtol=1e-4, atol=1e-4)
    assert tp2["loss"] == pytest.approx(tp1["loss"], rel=1e-4)
    assert tp2["grad_norm"] == pytest.approx(tp1["grad_norm"], rel=1e-4)
