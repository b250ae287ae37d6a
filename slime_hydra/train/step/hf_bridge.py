"""HF Qwen2 weights into this rank's GPTModel chunks, and the chunks back into an HF checkpoint,
with mbridge 0.15.1's Qwen2 bridge (the HF↔megatron-core mapping slime uses).

Its Qwen2 bridge is used for the name mapping, the q/k/v and gate/up merges, the TP splits and
merges and the PP broadcasts. What ours changes:
- we build the model ourselves (train/step/model.py: our layer spec, our packed attention, any
  device); mbridge's `get_model` hard-codes Transformer Engine and `.cuda()`;
- megatron's local layer spec names its norms `input_layernorm` and `pre_mlp_layernorm` (TE fuses
  them into the linear layers), so both are added to the mappings;
- its TransformerConfig is the chunks' own (fp32 on CPU, sequence parallelism as configured);
- Qwen2Bridge rewrites a class-level mapping when embeddings are tied, so a later untied model
  in the same process would load its embedding into the output layer: ours keeps a copy per
  instance;
- the vocabulary is padded as train/step/model.py pads it (a multiple of 128 × tp);
- on CPU, its PP broadcast allocates with `torch.cuda.current_device()`: mapped to the CPU.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import write_dir
from slime_hydra.hf.checkpoint import HfCheckpoint
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.step.shapes import padded_vocab_size

log = logging.getLogger(__name__)

SHARD_BYTES = 4 * 2**30
"""An export starts a new safetensors file past this many bytes (with an index, as HF does)."""

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _bridge_class() -> type:
    """Our Qwen2 bridge (mbridge is imported only when weights move)."""
    from mbridge.models.qwen2 import Qwen2Bridge

    class SlimeQwen2Bridge(Qwen2Bridge):
        _DIRECT_MAPPING = {  # noqa: RUF012 (copied per instance below)
            "embedding.word_embeddings.weight": "model.embed_tokens.weight",
            "decoder.final_layernorm.weight": "model.norm.weight",
            "output_layer.weight": "lm_head.weight",
        }
        _MLP_MAPPING = {  # noqa: RUF012
            **Qwen2Bridge._MLP_MAPPING,
            "pre_mlp_layernorm.weight": [
                "model.layers.{layer_number}.post_attention_layernorm.weight"
            ],
        }
        _OTHER_MAPPING = {  # noqa: RUF012
            "input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"],
        }

        def __init__(self, hf_config: Any, mcore_config: Any, vocab_size: int) -> None:
            from mbridge.core.parallel_states import ParallelStates

            self._mcore_config = mcore_config
            tp = parallel_state.get_tensor_model_parallel_world_size()
            super().__init__(
                hf_config,
                dtype=mcore_config.params_dtype,
                parallel_states=ParallelStates.get_parallel_state(),
                make_vocab_size_divisible_by=128 * tp,
            )
            self.vocab_size = vocab_size
            self.padded_vocab_size = padded_vocab_size(vocab_size, tp)

        def _build_config(self) -> Any:
            return self._mcore_config

        def _adjust_mapping_for_shared_weights(self) -> None:
            self._DIRECT_MAPPING = dict(type(self)._DIRECT_MAPPING)
            if getattr(self.hf_config, "tie_word_embeddings", False):
                self._DIRECT_MAPPING["output_layer.weight"] = "model.embed_tokens.weight"

    return SlimeQwen2Bridge


def _cpu_placements() -> None:
    """mbridge's PP broadcast allocates its receive buffer on `torch.cuda.current_device()`;
    on the CPU trainer the CPU shim's torch proxy (train/step/cpu_shim.py) places it on the CPU."""
    import mbridge.core.util as util

    from slime_hydra.train.step.cpu_shim import _CpuTorch

    if not isinstance(util.torch, _CpuTorch):
        util.torch = _CpuTorch()


def hf_config(dims: ModelDims) -> Any:
    """transformers' config: the checkpoint's own, or a Qwen2Config with a random model's dims."""
    from transformers import AutoConfig, Qwen2Config

    if dims.path is not None:
        return AutoConfig.from_pretrained(dims.path, local_files_only=True)
    if not (dims.swiglu and dims.normalization == "RMSNorm" and dims.add_qkv_bias):
        raise SlimeHydraError(
            f"trainer.export_hf=true writes a Qwen2 checkpoint, but model {dims.name} is not "
            "Qwen2-shaped (it needs swiglu, RMSNorm and add_qkv_bias); drop trainer.export_hf."
        )
    return Qwen2Config(
        vocab_size=dims.vocab_size,
        hidden_size=dims.hidden_size,
        intermediate_size=dims.ffn_hidden_size,
        num_hidden_layers=dims.num_layers,
        num_attention_heads=dims.num_attention_heads,
        num_key_value_heads=dims.num_query_groups,
        head_dim=dims.head_dim,
        max_position_embeddings=dims.max_position_embeddings,
        rms_norm_eps=dims.norm_epsilon,
        rope_parameters={"rope_type": "default", "rope_theta": dims.rotary_base},
        tie_word_embeddings=not dims.untie_embeddings_and_output_weights,
        architectures=["Qwen2ForCausalLM"],
    )


def make_bridge(chunks: list[torch.nn.Module], dims: ModelDims) -> Any:
    """A bridge for this rank's (unwrapped) chunks."""
    if next(chunks[0].parameters()).device.type == "cpu":
        _cpu_placements()
    return _bridge_class()(hf_config(dims), chunks[0].config, dims.vocab_size)


def unwrap(chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """The GPTModels inside megatron's DDP (or other) wrappers."""
    out = []
    for chunk in chunks:
        while hasattr(chunk, "module"):
            chunk = chunk.module
        out.append(chunk)
    return out


@torch.no_grad()
def load_hf_weights(chunks: list[torch.nn.Module], dims: ModelDims) -> None:
    """Load model.path's safetensors into this rank's chunks (every rank of the job calls it:
    TP rank 0 reads, the other TP ranks receive their shards)."""
    if dims.path is None:
        raise SlimeHydraError("load_hf_weights needs model.path (model=hf model.path=DIR).")
    models = unwrap(chunks)
    make_bridge(models, dims).load_weights(models, dims.path)
    if dist.get_rank() == 0:
        log.info("Loaded %s's weights (mbridge %s)", dims.path, _mbridge_version())


def _mbridge_version() -> str:
    from importlib.metadata import version

    return version("mbridge")


def export_hf(chunks: list[torch.nn.Module], dims: ModelDims, out_dir: Path) -> None:
    """Write the model as an HF checkpoint in `out_dir` (rank 0 writes; every rank calls):
    safetensors (sharded past SHARD_BYTES, with an index), config.json and the source dir's
    other files (generation config, tokenizer). The dir is written whole or not at all
    (files.write_dir: a fresh dir beside it, renamed into place; no symlink followed, a full
    disk named as such), so a failed export leaves the previous one. The bridge, the config and
    what the source checkpoint says (its dtypes and side files) come first; then every rank
    gathers the tensors (TP gathers, PP broadcasts), each on CPU in the source's dtype if any."""
    models = unwrap(chunks)
    bridge = make_bridge(models, dims)
    config = hf_config(dims) if dims.path is None else None
    source = None if dims.path is None else HfCheckpoint.open(dims.path)
    codes = {} if source is None else source.weight_dtypes()
    dtypes = {name: SAFETENSORS_DTYPES.get(code) for name, code in codes.items()}
    side_files = [] if source is None else source.side_files()
    tensors = (
        (name, tensor.detach().to("cpu", dtypes.get(name) or tensor.dtype).contiguous().clone())
        for name, tensor in bridge.export_weights(models)
    )
    if dist.get_rank() == 0:
        write_dir(
            out_dir, lambda stage: _write_export(tensors, config, side_files, stage), out_dir.parent
        )
    else:
        for _gathered in tensors:  # the other ranks take part in every gather, keeping nothing
            pass
    dist.barrier()


def _write_export(
    tensors: Iterator[tuple[str, torch.Tensor]],
    config: Any | None,
    side_files: list[Path],
    stage: Path,
) -> None:
    """Write the gathered tensors into `stage` in shards, then the names HF expects, and
    config.json (`config`, for a model without a source dir) or the source's side files."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            _flush(shards, stage)
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    _finish(shards, stage, config, side_files)


def _shard_name(i: int) -> str:
    return f"model-{i + 1:05d}.safetensors"


def _flush(shards: list[dict[str, torch.Tensor]], stage: Path) -> None:
    """Write the last shard; keep only its names (the tensors are freed)."""
    from safetensors.torch import save_file

    i = len(shards) - 1
    save_file(shards[i], str(stage / _shard_name(i)), metadata={"format": "pt"})
    shards[i] = dict.fromkeys(shards[i])


def _finish(
    shards: list[dict[str, Any]], stage: Path, config: Any | None, side_files: list[Path]
) -> None:
    """The last shard, the names HF expects (one file, or -of-N files and an index), and
    config.json or the source's side files."""
    _flush(shards, stage)
    n = len(shards)
    if n == 1:
        (stage / _shard_name(0)).rename(stage / "model.safetensors")
    else:
        weight_map = {}
        for i, names in enumerate(shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            (stage / _shard_name(i)).rename(stage / final)
            weight_map |= dict.fromkeys(names, final)
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (stage / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for file in side_files:
        shutil.copy2(file, stage / file.name)
    if config is not None:
        config.save_pretrained(str(stage))


def load_into_engine(engine: Any, dims: ModelDims) -> None:
    """Load model.path into a built engine's chunks, then refresh the optimizer's own copies
    (megatron's mixed-precision optimizers keep fp32 main params made from the seeded ones)."""
    load_hf_weights(engine.chunks, dims)
    reload = getattr(engine.optimizer, "reload_model_params", None)
    if reload is not None:
        reload()
