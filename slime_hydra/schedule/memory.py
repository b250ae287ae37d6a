"""Memory model for `trainer=plan`: the peak bytes on one GPU during a step's schedule.

Peak = static state + the activations held for backward at the worst moment of the pipeline
schedule actually used. Assumptions, stated once (l layers, h hidden, n heads, g query groups,
d head dim, f FFN width, V vocab, k = 3 with SwiGLU else 2; tp, pp, cp, dp the layout):

Activations, bf16, flash attention (no L² score tensors), no dropout, no recomputation; bytes
per token per layer
    2 · [4h / t_sp + (2·n·d + 2·g·d + k·f) / tp],   t_sp = tp with sequence parallelism, else 1:
4h the inputs of the two norms and of the QKV and FC1 linears (replicated over tp without
sequence parallelism); 2·n·d + 2·g·d the q, k, v flash attention keeps plus its output (the
output projection's input); k·f FC1's output and the activation's output (FC2's input).
Megatron's s·b·h·(34 + 5·a·s/h) (Korthikanti et al. 2022) is the same count for GELU with
f = 4h and g = n (32·h) plus two dropout masks (2·h) and the score tensors (5·a·s/h). The
last pipeline stage also keeps the loss's float32 copy of its vocab-parallel logits, 4·V/tp
bytes per token. Context parallelism splits a micro-batch's tokens over its cp GPUs; a stage's
l/pp layers split evenly over its vpp chunks. A (chunk, micro-batch)'s activations are held
from its forward to its backward in megatron's op order (`pipeline.stage_order`): 1F1B keeps
up to pp − s micro-batches in flight on stage s, interleaving its warm-up count plus one,
no pipelining one.

Static: parameters per GPU (matrices over tp, norms replicated, l/pp layers per stage, the
embedding on the first stage, the final norm and the output layer on the last, a tied
embedding's copy there too when pp > 1) × 18 bytes (bf16 weight 2, float32 gradient 4 as
megatron DDP reduces in float32, float32 master weight 4, Adam's two moments 8), or
6 + 12/(dp·cp) with the distributed optimizer (master weights and moments sharded over the
dp × cp ranks that hold the same parameters). Not modelled: vocab padding, CUDA context and
allocator fragmentation, communication buffers, transient backward workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slime_hydra.schedule.cost import ModelDims
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.pipeline import stage_order

GIB = 2**30
BYTES_PER_PARAM = 18
"""bf16 weight, float32 gradient, float32 master weight, Adam's two float32 moments."""
UNSHARDED_BYTES_PER_PARAM = 6
"""What the distributed optimizer leaves on every GPU: bf16 weight and float32 gradient."""


@dataclass(frozen=True)
class MemoryModel:
    """Peak bytes per GPU of one model under one layout (formulas in the module docstring)."""

    dims: ModelDims
    layout: ParallelLayout
    distributed_optimizer: bool = False

    @property
    def activation_bytes_per_token_layer(self) -> float:
        """Bytes one token keeps for backward in one transformer layer on one GPU."""
        d, lay = self.dims, self.layout
        k = 3 if d.swiglu else 2
        split = 2 * d.num_attention_heads * d.head_dim + 2 * d.num_query_groups * d.head_dim
        t_sp = lay.tp if lay.sequence_parallel else 1
        return 2 * (4 * d.hidden_size / t_sp + (split + k * d.ffn_hidden_size) / lay.tp)

    @property
    def logits_bytes_per_token(self) -> float:
        """Bytes one token keeps on the last stage for the loss: float32 vocab-parallel logits."""
        return 4 * self.dims.vocab_size / self.layout.tp

    @property
    def bytes_per_param(self) -> float:
        """Weight, gradient and optimizer state per parameter on one GPU."""
        if not self.distributed_optimizer:
            return BYTES_PER_PARAM
        shards = self.layout.dp * self.layout.cp
        return UNSHARDED_BYTES_PER_PARAM + (BYTES_PER_PARAM - UNSHARDED_BYTES_PER_PARAM) / shards

    def stage_params(self, stage: int) -> float:
        """Parameters on one GPU of pipeline stage `stage`."""
        d, tp, pp = self.dims, self.layout.tp, self.layout.pp
        h = d.hidden_size
        matrices = d.layer_matrix_params
        if d.add_qkv_bias:
            matrices += (d.num_attention_heads + 2 * d.num_query_groups) * d.head_dim
        norms = (2 if d.normalization == "RMSNorm" else 4) * h
        params = d.num_layers / pp * (matrices / tp + norms)
        embedding = d.vocab_size * h / tp
        if stage == 0:
            params += embedding
        if stage == pp - 1:
            final_norm = h if d.normalization == "RMSNorm" else 2 * h
            output_layer = d.untie_embeddings_and_output_weights or pp > 1
            params += final_norm + (embedding if output_layer else 0)
        return params

    def stage_activation_peak(self, stage: int, microbatch_tokens: Sequence[int]) -> float:
        """Most activation bytes one GPU of `stage` holds at once over one DP rank's micro-batches
        (tokens of each over its cp GPUs), replaying megatron's op order on that stage."""
        lay = self.layout
        per_chunk_token = self.dims.num_layers / (lay.pp * lay.vpp)
        per_chunk_token *= self.activation_bytes_per_token_layer
        last = stage == lay.pp - 1
        held = peak = 0.0
        for kind, chunk, mb in stage_order(
            stage, lay.pp, lay.vpp, lay.vp_group_size, len(microbatch_tokens)
        ):
            per_token = per_chunk_token
            if last and chunk == lay.vpp - 1:
                per_token += self.logits_bytes_per_token
            tokens = microbatch_tokens[mb] / lay.cp
            held += tokens * per_token if kind == "F" else -tokens * per_token
            peak = max(peak, held)
        return peak

    def peak_bytes(self, microbatch_tokens: Sequence[int]) -> float:
        """Peak bytes on the fullest GPU of one DP rank's pipeline over its micro-batches."""
        return max(
            self.stage_params(s) * self.bytes_per_param
            + self.stage_activation_peak(s, microbatch_tokens)
            for s in range(self.layout.pp)
        )
