"""Causal core attention in plain torch, for megatron-core layer specs without Transformer Engine.

megatron-core's `DotProductAttention` rejects packed (THD) input and allocates CUDA buffers;
`TEDotProductAttention` needs Transformer Engine. `PackedCausalAttention` takes the same
constructor and forward arguments and runs `scaled_dot_product_attention` once per packed
sequence, so no token attends across a sequence boundary. Heads arrive already split across
tensor-parallel ranks (the QKV projection is column-parallel), so each rank attends with its
own heads and query groups only.

Context parallelism: each CP rank holds chunks r and 2cp-1-r of every sequence (the zig-zag
layout of TE and `data/packing.py`). Keys and values are all-gathered over the CP group and put
back in sequence order; each local query attends to the keys at or before its global position.
Backward reduce-scatters the gathered keys' and values' gradients back to their ranks.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

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
        (True where a query may attend) when queries and keys are not aligned."""
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=mask is None,
            scale=self.softmax_scale,
            enable_gqa=self.num_heads_per_partition != self.num_query_groups_per_partition,
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
        """Causal attention inside each packed sequence; padding between sequences outputs zeros."""
        if query.dim() == 4:
            query, key, value = (x.squeeze(1) for x in (query, key, value))
        if self.cp_group.size() > 1:
            return self._forward_thd_cp(query, key, value, params, dropout_p)
        cu_q = params.cu_seqlens_q
        cu_kv = params.cu_seqlens_kv if params.cu_seqlens_kv is not None else cu_q
        if not torch.equal(cu_q.cpu(), cu_kv.cpu()):
            raise ValueError("self-attention needs cu_seqlens_kv equal to cu_seqlens_q")
        lengths = (cu_q[1:] - cu_q[:-1]).tolist()
        padded = params.cu_seqlens_q_padded
        starts = (padded if padded is not None else cu_q)[:-1].tolist()
        total = query.shape[0]
        if padded is None and sum(lengths) != total:
            raise ValueError(
                f"cu_seqlens_q covers {sum(lengths)} tokens but the packed input holds {total}"
            )
        out = query.new_zeros(total, self.num_heads_per_partition, self.head_dim)
        for start, length in zip(starts, lengths, strict=True):
            if length == 0:
                continue
            span = slice(start, start + length)
            q, k, v = (x[span].transpose(0, 1).unsqueeze(0) for x in (query, key, value))
            out[span] = self._attend(q, k, v, dropout_p).squeeze(0).transpose(0, 1)
        return out.reshape(total, -1)

    def _forward_thd_cp(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        params: PackedSeqParams,
        dropout_p: float,
    ) -> torch.Tensor:
        """This CP rank's queries against every rank's keys, causal by global position."""
        cp, rank = self.cp_group.size(), self.cp_group.rank()
        cu = params.cu_seqlens_q.to("cpu", torch.int64)
        local = query.shape[0]
        if int(cu[-1]) != local * cp:
            raise ValueError(
                f"cu_seqlens_q ends at {int(cu[-1])} but {cp} CP ranks hold {local} tokens each"
            )
        order = zigzag_order(cu, cp).to(query.device)
        keys = _GatherContextParallel.apply(key, self.cp_group)[order]
        values = _GatherContextParallel.apply(value, self.cp_group)[order]
        out = query.new_zeros(local, self.num_heads_per_partition, self.head_dim)
        for start, end in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            chunk = (end - start) // (2 * cp)
            if chunk == 0:
                continue
            lo = start // cp
            span = slice(lo, lo + 2 * chunk)
            within = torch.arange(2 * chunk, device=query.device)
            q_pos = torch.where(
                within < chunk,
                rank * chunk + within,
                (2 * cp - 1 - rank) * chunk + within - chunk,
            )
            k_pos = torch.arange(end - start, device=query.device)
            mask = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)
            q = query[span].transpose(0, 1).unsqueeze(0)
            k, v = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (keys, values))
            out[span] = self._attend(q, k, v, dropout_p, mask).squeeze(0).transpose(0, 1)
        return out.reshape(local, -1)


def zigzag_order(cu_seqlens: torch.Tensor, cp: int) -> torch.Tensor:
    """For each token of the full packed sequences (in order), its row in the CP all-gather:
    rank r's local tokens follow rank r-1's, and rank r holds chunks r and 2cp-1-r of every
    sequence (each sequence padded to a multiple of 2cp)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    pos = torch.arange(int(cu_seqlens[-1])) - cu_seqlens[seq]
    chunk = lengths[seq] // (2 * cp)
    part, offset = pos // chunk, pos % chunk
    first_half = part < cp
    owner = torch.where(first_half, part, 2 * cp - 1 - part)
    local_total = int(cu_seqlens[-1]) // cp
    return owner * local_total + cu_seqlens[seq] // cp + torch.where(first_half, 0, chunk) + offset


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
