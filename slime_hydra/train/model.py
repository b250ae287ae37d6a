"""Build a megatron-core GPTModel from conf/model dims: local layers on CPU, TE layers on GPU.

Call after `init_distributed` and `seed_everything`: megatron reads the TP/PP groups from
`parallel_state`, and CPU weights are drawn from the default torch generator as one full
master weight and then split, so every tp gives the same model for the same seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt import GPTModel, gpt_layer_specs
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from slime_hydra.errors import SlimeHydraError
from slime_hydra.train.attention import PackedCausalAttention
from slime_hydra.train.flops import ModelDims

Device = Literal["cpu", "cuda"]


class CpuRotaryEmbedding(RotaryEmbedding):
    """Megatron's RoPE table without its move of `inv_freq` to CUDA on first use."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        """RoPE angles [max_seq_len, 1, 1, head_dim] on the device of `inv_freq`."""
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        if self.rotary_interleaved:
            emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1)
            emb = emb.view(freqs.shape[0], -1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]


def padded_vocab_size(vocab_size: int, tp: int, divisible_by: int = 128) -> int:
    """Round the vocabulary up so each tensor-parallel shard is a multiple of `divisible_by`."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def transformer_config(
    dims: ModelDims,
    device: Device = "cpu",
    params_dtype: torch.dtype = torch.float32,
    sequence_parallel: bool = False,
) -> TransformerConfig:
    """Megatron TransformerConfig for `dims` on the current TP/PP/CP layout; no dropout (RL)."""
    on_cpu = device == "cpu"
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    return TransformerConfig(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        ffn_hidden_size=dims.ffn_hidden_size,
        num_attention_heads=dims.num_attention_heads,
        num_query_groups=dims.num_query_groups,
        kv_channels=dims.head_dim,
        normalization=dims.normalization,
        layernorm_epsilon=dims.norm_epsilon,
        gated_linear_unit=dims.swiglu,
        activation_func=F.silu if dims.swiglu else F.gelu,
        add_bias_linear=False,
        add_qkv_bias=dims.add_qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        sequence_parallel=sequence_parallel,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=(
            parallel_state.get_virtual_pipeline_model_parallel_world_size()
        ),
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype if pp > 1 else None,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=on_cpu,
        # The fused kernels below are CUDA extensions; on CPU megatron must take its torch paths.
        bias_activation_fusion=not on_cpu and dims.swiglu,
        bias_dropout_fusion=not on_cpu,
        masked_softmax_fusion=False,
        persist_layer_norm=not on_cpu,
        apply_rope_fusion=not on_cpu,
        gradient_accumulation_fusion=False,
    )


def layer_spec(dims: ModelDims, device: Device = "cpu") -> ModuleSpec:
    """Layer spec: megatron-local modules with packed causal attention on CPU, TE on GPU."""
    if device == "cuda":
        if not gpt_layer_specs.HAVE_TE:
            raise SlimeHydraError(
                "trainer=gpu builds Transformer Engine layers, but transformer_engine is not "
                "importable: install it (pip install transformer-engine[pytorch]) or use "
                "trainer=cpu."
            )
        # TE's fused norm+linear layers read RMSNorm/LayerNorm from config.normalization.
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    spec = gpt_layer_specs.get_gpt_layer_local_spec(normalization=dims.normalization)
    spec.submodules.self_attention.submodules.core_attention = PackedCausalAttention
    return spec


def build_gpt_model(
    model_cfg: ModelDims | Mapping[str, Any],
    device: Device = "cpu",
    vocab_size: int | None = None,
    params_dtype: torch.dtype = torch.float32,
    vp_stage: int | None = None,
    sequence_parallel: bool = False,
) -> GPTModel:
    """GPTModel for this rank's pipeline stage (VPP chunk `vp_stage`) and TP shard;
    `vocab_size` overrides the config's."""
    dims = model_cfg if isinstance(model_cfg, ModelDims) else ModelDims.from_mapping(model_cfg)
    config = transformer_config(dims, device, params_dtype, sequence_parallel)
    vocab = padded_vocab_size(
        vocab_size or dims.vocab_size, parallel_state.get_tensor_model_parallel_world_size()
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(dims, device),
        vocab_size=vocab,
        max_sequence_length=dims.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        share_embeddings_and_output_weights=not dims.untie_embeddings_and_output_weights,
        position_embedding_type=dims.position_embedding_type,
        rotary_base=int(dims.rotary_base),
        vp_stage=vp_stage,
    )
    if device == "cpu":
        model.rotary_pos_emb = CpuRotaryEmbedding(
            kv_channels=dims.head_dim,
            rotary_percent=1.0,
            rotary_base=int(dims.rotary_base),
            use_cpu_initialization=True,
            cp_group=parallel_state.get_context_parallel_group(),
        )
    else:
        model.cuda(torch.cuda.current_device())
    return model
