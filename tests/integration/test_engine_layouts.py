"""The one engine on CPU: megatron's own schedules (no pipelining, 1F1B, interleaved), DDP and
finalize_model_grads over gloo give a single-process reference's gradients and steps for every
layout, with micro-batch counts that change from step to step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.torchrun import torchrun

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("_engine_worker.py")

# (dp, tp, pp, vpp, microbatch_group_size_per_vp_stage, cp, model layers, token cap): each cap
# gives the two steps different micro-batch counts on that layout.
LAYOUTS = {
    "dp2": (2, 1, 1, 1, 1, 1, 2, 320),
    "tp2": (1, 2, 1, 1, 1, 1, 2, 320),
    "pp2": (1, 1, 2, 1, 2, 1, 2, 320),
    "pp2_vpp2_g2": (1, 1, 2, 2, 2, 1, 4, 320),
    "pp2_vpp2_g3": (1, 1, 2, 2, 3, 1, 4, 240),
    "pp4_vpp2": (1, 1, 4, 2, 4, 1, 8, 170),
    "cp2": (1, 1, 1, 1, 1, 2, 2, 320),
    "cp2_pp2": (1, 1, 2, 1, 2, 2, 2, 320),
}


def run_worker(out: Path, nproc: int, *args: str) -> list[dict[str, Any]]:
    """Run the worker on nproc gloo ranks; every rank's saved results, by rank."""
    out.mkdir(parents=True)
    torchrun(WORKER, nproc, str(out), *args, timeout=600)
    return [torch.load(out / f"rank_{r}.pt", weights_only=False) for r in range(nproc)]


def full_gradients(ranks: list[dict[str, Any]], step: int) -> dict[str, torch.Tensor]:
    """Whole-model gradients of `step` from DP rank 0, CP rank 0: TP shards concatenated."""
    shards: dict[str, list[tuple[int, int | None, torch.Tensor]]] = {}
    for rank in ranks:
        if rank["dp_rank"] == 0 and rank["cp_rank"] == 0:
            for name, shard in rank["grads"][step].items():
                shards.setdefault(name, []).append(shard)
    full = {}
    for name, parts in shards.items():
        parts.sort(key=lambda s: s[0])
        dim, grads = parts[0][1], [p[2] for p in parts]
        if dim is None:
            full[name] = grads[0]
        elif name.endswith("linear_fc1.weight"):  # each TP rank holds [gate; up] (SwiGLU)
            halves = [g.chunk(2) for g in grads]
            full[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        else:
            full[name] = torch.cat(grads, dim=dim)
    return full


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """The single-process reference per model depth, computed once."""
    out = {}
    for layers in sorted({spec[6] for spec in LAYOUTS.values()}):
        path = tmp_path_factory.mktemp(f"reference_{layers}")
        (out[layers],) = run_worker(path / "out", 1, str(layers), "reference")
    return out


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_trains_like_the_single_process_reference(
    name: str, references: dict[int, dict[str, Any]], tmp_path: Path
) -> None:
    dp, tp, pp, vpp, g, cp, layers, cap = LAYOUTS[name]
    ranks = run_worker(
        tmp_path / "out", dp * tp * pp * cp, *map(str, (layers, cap, dp, tp, pp, vpp, g, cp))
    )
    reference = references[layers]
    for rank, saved in enumerate(ranks):  # what a resume checks a checkpoint against
        assert saved["weight_shapes"] == saved["expected_shapes"], rank
    counts = ranks[0]["num_microbatches"]
    assert len(set(counts)) == 2, f"the steps' micro-batch counts should differ: {counts}"
    if vpp > 1:
        assert all(m % g == 0 and m >= g for m in counts), counts
    for step in range(len(counts)):
        got, want = full_gradients(ranks, step), full_gradients([reference], step)
        assert got.keys() == want.keys()
        assert any(float(w.abs().sum()) > 0 for w in want.values())
        for key, grad in want.items():
            torch.testing.assert_close(got[key], grad, rtol=1e-4, atol=1e-7, msg=key)
    for got, want in zip(ranks[0]["steps"], reference["steps"], strict=True):
        assert not got.skipped
        assert got.loss == pytest.approx(want["loss"], rel=1e-4)
        assert got.grad_norm == pytest.approx(want["grad_norm"], rel=1e-4)
    assert ranks[0]["steps"][0].grad_norm > 0.05, "the clip at 0.05 should act"
