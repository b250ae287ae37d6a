"""Build megatron-core GPTModel chunks from conf/model dims: Transformer Engine layers on CUDA
where TE is installed, megatron's local layers with our packed attention elsewhere.

Weights depend on the seed only, not on the tp/pp/vpp split or the device (`init_weights`).
"""

from __future__ import annotations

import contextlib
import math
import zlib
from collections.abc import Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt import GPTModel, gpt_layer_specs
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.step.attention import PackedCausalAttention
from slime_hydra.train.step.shapes import padded_vocab_size

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


def has_transformer_engine() -> bool:
    """Whether megatron-core can build Transformer Engine layers here."""
    return gpt_layer_specs.HAVE_TE


def uses_transformer_engine(device: Device) -> bool:
    """Whether the model on `device` is built of Transformer Engine layers (CUDA, TE there)."""
    return device == "cuda" and has_transformer_engine()


def seq_params_device(device: Device) -> Device | None:
    """Where the layers want cu_seqlens: on the GPU for TE's kernels; on the host (None) for
    megatron's local layers, whose unfused RoPE and our attention read them as numbers."""
    return device if uses_transformer_engine(device) else None


def keep_weight(weight: torch.Tensor) -> None:
    """megatron's init method for every weight: draw nothing, `init_weights` draws each once."""


def transformer_config(
    dims: ModelDims,
    device: Device = "cpu",
    params_dtype: torch.dtype = torch.float32,
    sequence_parallel: bool = False,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> TransformerConfig:
    """Megatron TransformerConfig for `dims` on the current TP/PP/VPP/CP layout; no dropout (RL).

    Packed micro-batches differ in length, so pipeline stages exchange shapes
    (`variable_seq_lengths`) and the loss is normalised per token by megatron
    (`calculate_per_token_loss`). With VPP, megatron's default batched p2p swaps activation and
    gradient shapes when the previous and next stage are the same rank (pp=2; NVIDIA/Megatron-LM
    #1450): overlapped, unbatched p2p avoids it (and megatron refuses it without VPP).
    """
    fused = uses_transformer_engine(device)
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    interleaved = vpp is not None and vpp > 1
    config = TransformerConfig(
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
        virtual_pipeline_model_parallel_size=vpp,
        microbatch_group_size_per_vp_stage=microbatch_group_size_per_vp_stage,
        context_parallel_size=parallel_state.get_context_parallel_world_size(),
        calculate_per_token_loss=True,
        # schedule/pipeline.py replays these p2p calls (overlapped under VPP, batched without).
        overlap_p2p_comm=interleaved,
        batch_p2p_comm=not interleaved,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=True,
        # `init_weights` draws every matrix; megatron drawing them first as well would double
        # the build time (minutes of one CPU thread for 1.5B parameters). Not
        # perform_initialization=False: megatron then leaves biases unset and weights without
        # their tensor-parallel attributes.
        init_method=keep_weight,
        output_layer_init_method=keep_weight,
        embedding_init_method=keep_weight,
        # The fused kernels below come with Transformer Engine (or apex); without them megatron
        # must take its plain torch paths.
        bias_activation_fusion=fused and dims.swiglu,
        bias_dropout_fusion=fused,
        masked_softmax_fusion=False,
        persist_layer_norm=fused,
        apply_rope_fusion=fused,
        gradient_accumulation_fusion=False,
    )
    # Set after construction: __post_init__ refuses it for the (unused) MoE allgather dispatcher.
    config.variable_seq_lengths = True
    return config


def layer_spec(dims: ModelDims, device: Device = "cpu") -> ModuleSpec:
    """Transformer Engine layers on CUDA where TE is installed; otherwise megatron's local layers
    with our packed causal attention (plain torch SDPA per packed sequence, any device)."""
    if uses_transformer_engine(device):
        # TE's fused norm+linear layers read RMSNorm/LayerNorm from config.normalization.
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    spec = gpt_layer_specs.get_gpt_layer_local_spec(normalization=dims.normalization)
    spec.submodules.self_attention.submodules.core_attention = PackedCausalAttention
    return spec


def global_name(name: str, chunk: GPTModel, tied: bool) -> str:
    """A parameter's name in the whole model: local layer index → global layer number; a tied
    output layer is the word embedding."""
    if tied and name == "output_layer.weight":
        return "embedding.word_embeddings.weight"
    prefix = "decoder.layers."
    if not name.startswith(prefix):
        return name
    index, rest = name[len(prefix) :].split(".", 1)
    return f"{prefix}{chunk.decoder.layers[int(index)].layer_number - 1}.{rest}"


def init_weights(chunks: list[GPTModel], dims: ModelDims, seed: int, std: float = 0.02) -> None:
    """Draw every matrix from a generator seeded by (seed, its global name), in full, then keep
    this rank's TP shard: the same model for any tp/pp/vpp split and on CPU or GPU.

    Megatron's own initialisation draws in construction order, so each pipeline stage would
    draw different weights; its init methods are `keep_weight` here, and this keeps its
    distributions (normal(0, std), output projections scaled by 1/sqrt(2·layers); norms and
    biases as built). Padded vocabulary rows are zero.
    """
    tp = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tied = not dims.untie_embeddings_and_output_weights
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if param.dim() < 2:
                continue
            full_name = global_name(name, chunk, tied)
            sharded = getattr(param, "tensor_model_parallel", False)
            dim = param.partition_dim if sharded else 0
            shape = list(param.shape)
            shape[dim] *= tp if sharded else 1
            scaled = full_name.endswith(("linear_proj.weight", "linear_fc2.weight"))
            sigma = std / math.sqrt(2 * dims.num_layers) if scaled else std
            vocab = "word_embeddings" in full_name or "output_layer" in full_name
            rows = dims.vocab_size if vocab else 0
            key = (seed * 1_000_003 + zlib.crc32(full_name.encode())) % 2**63
            gen = torch.Generator().manual_seed(key)
            if rows:
                full = torch.zeros(shape)
                full[:rows].normal_(0.0, sigma, generator=gen)
            else:
                full = torch.empty(shape).normal_(0.0, sigma, generator=gen)
            if not sharded:
                shard = full
            elif dims.swiglu and full_name.endswith("linear_fc1.weight"):
                # Megatron's gated fc1 holds [gate; up] on every TP rank: shard both halves.
                shard = torch.cat([half.chunk(tp)[tp_rank] for half in full.chunk(2)])
            else:
                shard = full.chunk(tp, dim=dim)[tp_rank]
            with torch.no_grad():
                param.copy_(shard)


@contextlib.contextmanager
def tensors_stay_on_cpu() -> Iterator[None]:
    """While a GPTModel is built on CPU: with tied embeddings and pp>1, megatron-core 0.16.1's
    `setup_embeddings_and_output_layer` moves the shared weight to CUDA (`weight.data.cuda()`)
    before all-reducing it between the first and last stage; here it stays on the CPU."""
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda


def build_gpt_model(
    dims: ModelDims,
    device: Device = "cpu",
    params_dtype: torch.dtype = torch.float32,
    vp_stage: int | None = None,
    sequence_parallel: bool = False,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> GPTModel:
    """GPTModel for this rank's pipeline stage (VPP chunk `vp_stage`) and TP shard."""
    config = transformer_config(
        dims, device, params_dtype, sequence_parallel, microbatch_group_size_per_vp_stage
    )
    placement = tensors_stay_on_cpu() if device == "cpu" else contextlib.nullcontext()
    with placement:
        model = GPTModel(
            config=config,
            transformer_layer_spec=layer_spec(dims, device),
            vocab_size=padded_vocab_size(
                dims.vocab_size, parallel_state.get_tensor_model_parallel_world_size()
            ),
            max_sequence_length=dims.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(
                ignore_virtual=False, vp_stage=vp_stage
            ),
            post_process=parallel_state.is_pipeline_last_stage(
                ignore_virtual=False, vp_stage=vp_stage
            ),
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
    return model


def build_model_chunks(
    dims: ModelDims,
    seed: int,
    device: Device = "cpu",
    params_dtype: torch.dtype = torch.float32,
    sequence_parallel: bool = False,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> list[GPTModel]:
    """This rank's model chunks (one per VPP stage), initialised by `init_weights`, on `device`.

    Call after `init_distributed`: megatron reads the TP/PP/VPP/CP groups from `parallel_state`.
    """
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
    chunks = [
        build_gpt_model(
            dims,
            device,
            params_dtype,
            vp_stage=stage if vpp > 1 else None,
            sequence_parallel=sequence_parallel,
            microbatch_group_size_per_vp_stage=microbatch_group_size_per_vp_stage,
        )
        for stage in range(vpp)
    ]
    init_weights(chunks, dims, seed)
    if device == "cuda":
        for chunk in chunks:
            chunk.cuda(torch.cuda.current_device())
    return chunks
