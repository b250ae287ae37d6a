"""Causal core attention in plain torch, for megatron-core layer specs on CPU.

megatron-core's `DotProductAttention` rejects packed (THD) input and allocates CUDA buffers;
`TEDotProductAttention` needs Transformer Engine. `PackedCausalAttention` takes the same
constructor and forward arguments and runs `scaled_dot_product_attention` once per packed
sequence, so no token attends across a sequence boundary. Heads arrive already split across
tensor-parallel ranks (the QKV projection is column-parallel), so each rank attends with its
own heads and query groups only.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
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
        if config.context_parallel_size != 1:
            raise ValueError(
                "PackedCausalAttention has no context parallelism: set parallel.cp=1 or use "
                "trainer=gpu (Transformer Engine attention)"
            )
        if config.window_size is not None or config.softmax_type != "vanilla":
            raise ValueError(
                "PackedCausalAttention supports only full causal attention with a vanilla "
                "softmax (no window_size, softmax_type='vanilla')"
            )
        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.padding_causal):
            raise ValueError(f"PackedCausalAttention is causal only, got {attn_mask_type}")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
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
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float
    ) -> torch.Tensor:
        """Causal SDPA on [b, heads, s, hn] tensors, with GQA key/value groups."""
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=dropout_p,
            is_causal=True,
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
