"""The shapes of a rank's weights as model.py builds them, from the model dims and the parallel
layout alone (plain Python: no torch, no model built), so a checkpoint's tensors can be checked
against this run's model before any worker starts.

Keys are those of the engine's `ModuleList` of model chunks: `<chunk>.<megatron name>`, layers
numbered within their chunk. Ranks are placed in megatron-core's default order (tp-cp-ep-dp-pp):
rank = tp_rank + tp·(cp_rank + cp·(dp_rank + dp·pp_rank)); chunk c of pipeline rank p is model
stage c·pp + p. Transformer Engine's layers fuse the two per-layer norms into the linear layers
that follow them (`linear_qkv.layer_norm_weight`), so with `fused_norms` those are not named.
"""

from __future__ import annotations

from slime_hydra.schedule import ParallelLayout
from slime_hydra.schedule.cost import ModelDims

Shape = tuple[int, ...]

LAYER_KEYS = {
    "self_attention.linear_qkv": ("model.hidden_size", "model.num_attention_heads"),
    "self_attention.linear_proj": ("model.hidden_size", "model.num_attention_heads"),
    "mlp.linear_fc1": ("model.hidden_size", "model.ffn_hidden_size", "model.swiglu"),
    "mlp.linear_fc2": ("model.hidden_size", "model.ffn_hidden_size"),
}
"""A layer's matrices and the config keys (besides parallel.tp) that fix their shapes."""


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Round the vocabulary up so each tensor-parallel shard is a multiple of `divisible_by`."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def fixed_by(key: str) -> tuple[str, ...]:
    """The config keys that fix the shape of the weight named `key`."""
    for name, keys in LAYER_KEYS.items():
        if f".{name}." in key:
            extra = ("model.num_query_groups", "model.kv_channels") if "qkv" in key else ()
            return (*keys, *extra, "parallel.tp")
    if "word_embeddings" in key or "output_layer" in key:
        return ("model.vocab_size", "model.hidden_size", "parallel.tp")
    return ("model.hidden_size", "model.normalization")


def weight_shapes(
    dims: ModelDims, layout: ParallelLayout, rank: int, fused_norms: bool = False
) -> dict[str, Shape]:
    """{state_dict key: shape} of every weight rank `rank` holds (no `_extra_state` entries), in
    the order of the chunks' `named_parameters()`, which torch's optimizer pairs moments by."""
    tp, pp, vpp = layout.tp, layout.pp, layout.vpp
    tp_dp_cp = layout.tp * layout.dp * layout.cp
    pp_rank = rank // tp_dp_cp
    h, ffn = dims.hidden_size, dims.ffn_hidden_size
    q = dims.num_attention_heads * dims.head_dim
    qkv = q + 2 * dims.num_query_groups * dims.head_dim
    vocab = padded_vocab_size(dims.vocab_size, tp) // tp
    norm = ("weight", "bias") if dims.normalization == "LayerNorm" else ("weight",)
    tied = not dims.untie_embeddings_and_output_weights
    layers = dims.num_layers // (pp * vpp)
    shapes: dict[str, Shape] = {}
    for chunk in range(vpp):
        first = pp_rank == 0 and chunk == 0
        last = pp_rank == pp - 1 and chunk == vpp - 1
        at = f"{chunk}."
        if first:
            shapes[at + "embedding.word_embeddings.weight"] = (vocab, h)
        for layer in range(layers):
            p = f"{at}decoder.layers.{layer}."
            for part in () if fused_norms else norm:
                shapes[f"{p}input_layernorm.{part}"] = (h,)
            shapes[p + "self_attention.linear_proj.weight"] = (h, q // tp)
            shapes[p + "self_attention.linear_qkv.weight"] = (qkv // tp, h)
            if dims.add_qkv_bias:
                shapes[p + "self_attention.linear_qkv.bias"] = (qkv // tp,)
            for part in () if fused_norms else norm:
                shapes[f"{p}pre_mlp_layernorm.{part}"] = (h,)
            shapes[p + "mlp.linear_fc1.weight"] = ((2 if dims.swiglu else 1) * ffn // tp, h)
            shapes[p + "mlp.linear_fc2.weight"] = (h, ffn // tp)
        if last:
            for part in norm:
                shapes[f"{at}decoder.final_layernorm.{part}"] = (h,)
            if not (tied and first):  # a tied single stage reuses the embedding
                shapes[at + "output_layer.weight"] = (vocab, h)
    return shapes
