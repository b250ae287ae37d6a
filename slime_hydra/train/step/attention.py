"""Causal core attention in plain torch, for megatron-core layer specs without Transformer Engine.

megatron-core's `DotProductAttention` rejects packed (THD) input and allocates CUDA buffers;
`TEDotProductAttention` needs Transformer Engine. `PackedCausalAttention` takes the same
constructor and forward arguments and runs `scaled_dot_product_attention` once per packed
sequence, so no token attends across a sequence boundary. Heads arrive already split across
tensor-parallel ranks (the QKV projection is column-parallel), so each rank attends with its
own heads and query groups only.

Context parallelism: each CP rank holds chunks r and 2cp-1-r of every sequence (the zig-zag
layout of TE and `data/packing.py`). Keys and values are all-gathered over the CP group; each
local chunk p attends to the sequence's chunks 0..p, causally by global position (a
lower-right causal mask). Backward reduce-scatters the gathered keys' and values' gradients
back to their ranks. A masked call gets keys and values expanded to every query head: SDPA's
memory-efficient kernel takes a mask but not `enable_gqa`, and the math kernel, which takes
both, holds fp32 scores of every head.

Sequence boundaries come as Python ints (`data.packing.ThdParams.bounds`), so the forward
reads nothing back from the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from itertools import pairwise

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class PackedCausalAttention(MegatronModule):
    """Drop-in `core_attention` for SelfAttention: causal per packed sequence, any device.

    `layer_number`, `attention_type` and `cp_comm_type` are taken only to match the signature
    that megatron's layer specs call core attention with.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
    ) -> None:
        super().__init__(config=config)
        if config.window_size is not None or config.softmax_type != "vanilla":
            raise ValueError(
                "PackedCausalAttention supports only full causal attention with a vanilla "
                "softmax (no window_size, softmax_type='vanilla')"
            )
        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"PackedCausalAttention is causal only, got {attn_mask_type}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        tp_size = pg_collection.tp.size()
        self.cp_group = pg_collection.cp
        self.num_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, tp_size)
        self.head_dim = config.kv_channels
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        )
        self.dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: PackedSeqParams | None = None,
    ) -> torch.Tensor:
        """Attend causally: THD [t, np, hn] → [t, np·hn]; SBHD [s, b, np, hn] → [s, b, np·hn]."""
        if attention_bias is not None:
            raise ValueError("PackedCausalAttention does not support attention_bias")
        dropout_p = self.dropout_p if self.training else 0.0
        # Dropout draws from the tensor-parallel RNG state, as in DotProductAttention.
        rng = tensor_parallel.get_cuda_rng_tracker().fork() if dropout_p > 0 else nullcontext()
        with rng:
            if packed_seq_params is not None and packed_seq_params.qkv_format == "thd":
                return self._forward_thd(query, key, value, packed_seq_params, dropout_p)
            return self._forward_sbhd(query, key, value, dropout_p)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """SDPA on [b, heads, s, hn] tensors with GQA key/value groups: causal, or under `mask`
        (True where a query may attend) when queries and keys are not aligned; a masked call
        gets k and v repeated to every query head, so a fused kernel can take it."""
        groups = self.num_heads_per_partition // self.num_query_groups_per_partition
        if mask is not None and groups > 1:
            k, v = (x.repeat_interleave(groups, dim=1) for x in (k, v))
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=mask is None,
            scale=self.softmax_scale,
            enable_gqa=mask is None and groups > 1,
        )

    def _forward_sbhd(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float
    ) -> torch.Tensor:
        """One causal sequence per batch row; the attention mask is implied, as in TE's causal."""
        seq_len, batch = query.shape[:2]
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        out = self._attend(q, k, v, dropout_p)
        return out.permute(2, 0, 1, 3).reshape(seq_len, batch, -1)

    def _forward_thd(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        params: PackedSeqParams,
        dropout_p: float,
    ) -> torch.Tensor:
        """Causal attention inside each packed sequence. The input is split into sequences
        once and their outputs concatenated once: autograd's backward of a slice (or of a write
        into a slice) makes a tensor of the whole input, so one per sequence is quadratic in a
        micro-batch of many short sequences."""
        if query.dim() == 4:
            query, key, value = (x.squeeze(1) for x in (query, key, value))
        bounds = sequence_bounds(params)
        if self.cp_group.size() > 1:
            keys = _GatherContextParallel.apply(key, self.cp_group)
            values = _GatherContextParallel.apply(value, self.cp_group)
            return self.attend_context_parallel(
                query, keys, values, bounds, self.cp_group.size(), self.cp_group.rank(), dropout_p
            )
        total = query.shape[0]
        if bounds[-1] != total:
            raise ValueError(
                f"cu_seqlens_q covers {bounds[-1]} tokens but the packed input holds {total}"
            )
        sizes = [end - start for start, end in pairwise(bounds)]
        parts = []
        for size, *qkv in zip(sizes, *(x.split(sizes) for x in (query, key, value)), strict=True):
            if size:
                q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in qkv)
                parts.append(self._attend(q, k, v, dropout_p).squeeze(0).transpose(0, 1))
        return torch.cat(parts).reshape(total, -1)

    def attend_context_parallel(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        bounds: tuple[int, ...],
        cp: int,
        rank: int,
        dropout_p: float,
    ) -> torch.Tensor:
        """CP rank `rank`'s queries [local, np, hn] against the keys and values of all CP
        ranks ([cp·local, ng, hn], rank by rank, as all-gathered), causal by global position."""
        local = query.shape[0]
        if bounds[-1] != local * cp:
            raise ValueError(
                f"cu_seqlens_q ends at {bounds[-1]} but {cp} CP ranks hold {local} tokens each"
            )
        chunks = [(end - start) // (2 * cp) for start, end in pairwise(bounds)]
        halves = query.split([c for c in chunks for _ in range(2)])
        key_chunks = sequence_chunks(keys, chunks, cp)
        value_chunks = sequence_chunks(values, chunks, cp)
        parts = []  # rows in order: each sequence's two local chunks follow the last's
        for s, chunk in enumerate(chunks):
            if chunk == 0:
                continue
            for half, part in enumerate((rank, 2 * cp - 1 - rank)):
                q = halves[2 * s + half].transpose(0, 1).unsqueeze(0)
                k, v = (
                    torch.cat(x[s][: part + 1]).transpose(0, 1).unsqueeze(0)
                    for x in (key_chunks, value_chunks)
                )
                mask = torch.ones(
                    chunk, (part + 1) * chunk, dtype=torch.bool, device=query.device
                ).tril(part * chunk)
                attended = self._attend(q, k, v, dropout_p, mask)
                parts.append(attended.squeeze(0).transpose(0, 1))
        return torch.cat(parts).reshape(local, -1)


def sequence_bounds(params: PackedSeqParams) -> tuple[int, ...]:
    """The packed sequences' boundaries as Python ints (`ThdParams.bounds`)."""
    bounds = getattr(params, "bounds", ())
    if not bounds:
        raise ValueError(
            "PackedCausalAttention needs the sequence boundaries as Python ints: pass "
            "slime_hydra.data.packing.thd_params(...) (a PackedSeqParams with `bounds`)"
        )
    if params.cu_seqlens_q_padded is not None or params.cu_seqlens_kv is not params.cu_seqlens_q:
        raise ValueError(
            "PackedCausalAttention is self-attention over unpadded cu_seqlens: cu_seqlens_kv "
            "must be cu_seqlens_q and cu_seqlens_q_padded unset"
        )
    return bounds


def sequence_chunks(gathered: torch.Tensor, chunks: Sequence[int], cp: int) -> list[list]:
    """Each sequence's 2cp chunks in order, out of the CP all-gather (rank r's rows hold chunks
    r and 2cp-1-r of every sequence, `chunks[s]` tokens each, in sequence order), in one split:
    its backward joins the gradient once, where a slice per chunk would make a tensor of the
    whole gather for each."""
    n = len(chunks)
    pieces = gathered.split([c for _ in range(cp) for c in chunks for _ in range(2)])
    return [
        [
            pieces[2 * (c * n + s)] if c < cp else pieces[2 * ((2 * cp - 1 - c) * n + s) + 1]
            for c in range(2 * cp)
        ]
        for s in range(n)
    ]


class _GatherContextParallel(torch.autograd.Function):
    """All-gather rows over the CP group; backward reduce-scatters the gradient (sum)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        out = x.new_empty((x.shape[0] * group.size(), *x.shape[1:]))
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):
        group = ctx.group
        out = grad.new_empty((grad.shape[0] // group.size(), *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=group)
        return out, None
