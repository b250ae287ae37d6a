"""PackedCausalAttention (train/step/attention.py) on the CPU against a float64 causal reference:
packed sequences, and one CP rank's queries against all ranks' keys (the zig-zag split). The
forward reads nothing back from the tensors (no host sync on a GPU), and under CP every masked
SDPA call has keys for every query head (no enable_gqa), so a fused kernel can take the mask."""

from __future__ import annotations

import math
from itertools import accumulate, pairwise

import pytest
import torch
import torch.nn.functional as F
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.overrides import TorchFunctionMode

from slime_hydra.data.packing import thd_params
from slime_hydra.train.step.attention import PackedCausalAttention
from tests.single_rank import single_rank

HEADS, GROUPS, DIM = 4, 2, 8
HOST_READS = {"tolist", "cpu", "item", "numpy", "__bool__", "__int__", "__float__", "__index__"}
"""Tensor methods that copy a value to the host: a device sync for a CUDA tensor."""


class Calls(TorchFunctionMode):
    """Records each torch call (name and kwargs) made under it, then runs the call as is."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.calls.append((getattr(func, "__name__", str(func)), args, kwargs))
        return func(*args, **kwargs)

    def names(self) -> set[str]:
        return {name for name, _, _ in self.calls}


@pytest.fixture(scope="module")
def attention():
    config = TransformerConfig(
        num_layers=1,
        hidden_size=HEADS * DIM,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        kv_channels=DIM,
        attention_dropout=0.0,
        hidden_dropout=0.0,
    )
    with single_rank():
        yield PackedCausalAttention(config, 1, AttnMaskType.causal, "self")


def draw(total: int, heads: int, seed: int) -> torch.Tensor:
    return torch.randn(total, heads, DIM, generator=torch.Generator().manual_seed(seed))


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of one whole sequence [s, heads, dim] in float64, GQA by hand."""
    qs, ks, vs = (x.double().transpose(0, 1) for x in (q, k, v))
    ks, vs = (x.repeat_interleave(HEADS // GROUPS, dim=0) for x in (ks, vs))
    scores = qs @ ks.transpose(1, 2) / math.sqrt(DIM)
    future = torch.ones(len(q), len(q), dtype=torch.bool).triu(1)
    out = scores.masked_fill(future, float("-inf")).softmax(-1) @ vs
    return out.transpose(0, 1).reshape(len(q), -1)


def test_packed_sequences_attend_within_themselves_reading_nothing_back(attention):
    lengths = [1, 7, 20, 5]
    bounds = [0, *accumulate(lengths)]
    q, k, v = draw(bounds[-1], HEADS, 0), draw(bounds[-1], GROUPS, 1), draw(bounds[-1], GROUPS, 2)
    params = thd_params(bounds)
    with Calls() as calls:
        out = attention(q, k, v, None, packed_seq_params=params)
    assert not calls.names() & HOST_READS
    for a, b in pairwise(bounds):
        want = reference(q[a:b], k[a:b], v[a:b])
        assert torch.allclose(out[a:b].double(), want, rtol=1e-5, atol=1e-6)


def zigzag(x: torch.Tensor, lengths: list[int], cp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s rows of full sequences x [T, ...]: chunks rank and 2cp-1-rank of each."""
    parts, start = [], 0
    for n in lengths:
        c = n // (2 * cp)
        for j in (rank, 2 * cp - 1 - rank):
            parts.append(x[start + j * c : start + (j + 1) * c])
        start += n
    return torch.cat(parts)


@pytest.mark.parametrize("cp", [2, 3])
def test_context_parallel_ranks_attend_causally_by_global_position(attention, cp):
    lengths = [4 * cp, 2 * cp, 6 * cp]  # chunks of 2, 1 and 3 tokens
    bounds = [0, *accumulate(lengths)]
    q, k, v = draw(bounds[-1], HEADS, 3), draw(bounds[-1], GROUPS, 4), draw(bounds[-1], GROUPS, 5)
    keys = torch.cat([zigzag(k, lengths, cp, r) for r in range(cp)])  # as all-gathered
    values = torch.cat([zigzag(v, lengths, cp, r) for r in range(cp)])
    want = torch.cat([reference(q[a:b], k[a:b], v[a:b]) for a, b in pairwise(bounds)])
    for rank in range(cp):
        local_q = zigzag(q, lengths, cp, rank)
        with Calls() as calls:
            out = attention.attend_context_parallel(
                local_q, keys, values, tuple(bounds), cp, rank, 0.0
            )
        assert not calls.names() & HOST_READS
        assert torch.allclose(out.double(), zigzag(want, lengths, cp, rank), rtol=1e-5, atol=1e-6)
        sdpa = [(a, kw) for n, a, kw in calls.calls if n == F.scaled_dot_product_attention.__name__]
        # Local chunk p of a sequence with chunks of c tokens attends to its chunks 0..p: a
        # c × (p+1)·c mask, lower-right causal; keys and values expanded to all HEADS heads.
        want_shapes = [
            (c, (p + 1) * c)
            for c in (n // (2 * cp) for n in lengths)
            for p in (rank, 2 * cp - 1 - rank)
        ]
        assert [tuple(kw["attn_mask"].shape) for _, kw in sdpa] == want_shapes
        for (q_, k_, v_), kw in sdpa:
            assert q_.shape[1] == k_.shape[1] == v_.shape[1] == HEADS
            assert not kw["enable_gqa"] and not kw["is_causal"]
            c, s = kw["attn_mask"].shape
            offset = s - c
            expected = torch.tensor([[j <= offset + i for j in range(s)] for i in range(c)])
            assert torch.equal(kw["attn_mask"], expected)


def test_plain_packed_seq_params_are_refused_naming_the_builder(attention):
    cu = torch.tensor([0, 4], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    with pytest.raises(ValueError, match=r"thd_params"):
        q, k, v = draw(4, HEADS, 0), draw(4, GROUPS, 1), draw(4, GROUPS, 2)
        attention(q, k, v, None, packed_seq_params=params)


def graph_names(tensor: torch.Tensor) -> set[str]:
    """The names of every autograd node behind `tensor`."""
    seen, stack, names = set(), [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack += [next_node for next_node, _ in node.next_functions]
    return names


@pytest.mark.parametrize("cp", [1, 2])
def test_sequences_are_split_and_joined_once(attention, cp):
    # A slice (or a slice write) per sequence puts a node in the graph whose backward makes a
    # tensor of the whole input (output): quadratic in a micro-batch of many short sequences.
    lengths = [4 * cp] * 6
    bounds = [0, *accumulate(lengths)]
    q, k, v = (
        draw(bounds[-1], h, s).requires_grad_() for h, s in ((HEADS, 6), (GROUPS, 7), (GROUPS, 8))
    )
    if cp == 1:
        out = attention(q, k, v, None, packed_seq_params=thd_params(bounds))
    else:
        local = zigzag(q.detach(), lengths, cp, 0).requires_grad_()
        out = attention.attend_context_parallel(local, k, v, tuple(bounds), cp, 0, 0.0)
    assert "CatBackward0" in graph_names(out)
    assert not any(name.startswith(("CopySlices", "Slice")) for name in graph_names(out))
