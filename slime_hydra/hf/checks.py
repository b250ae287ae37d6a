"""What a trainer checks about the model's source before any worker starts: the checkpoint
(config.json, every weight's shape), the tokenizer against it, and whether an export can be
written. Torch-free; the tokenizer check imports transformers only when data has a tokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, get_args, get_type_hints

from omegaconf import DictConfig, OmegaConf

from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checkpoint import HfCheckpoint
from slime_hydra.schedule.cost import ModelDims


def _bad_value(name: str, value: Any, hint: Any) -> str | None:
    """What is wrong with `value` for ModelDims field `name` of type `hint` (None: nothing)."""
    optional = type(None) in get_args(hint)
    kind = next((t for t in (bool, int, float, str) if t is hint or t in get_args(hint)), None)
    if value is None:
        return None if optional else "must be set"
    if kind is bool:
        return None if isinstance(value, bool) else "is not true or false"
    if kind is str:
        return None if isinstance(value, str) else "is not a string"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "is not a number"
    if kind is int:
        if not isinstance(value, int):
            return "is not an integer (a model dim is a whole count, never rounded)"
        return None if 1 <= value < 2**63 else "is not a positive integer"
    return None if 0 < value < float("inf") else "is not a finite number above 0"


def check_model_values(model: Mapping[str, Any]) -> None:
    """Every model dim a positive integer, every float finite and above 0, every flag a bool:
    a zero or negative dim would otherwise be simulated, or divide by zero."""
    hints = get_type_hints(ModelDims)
    for f in fields(ModelDims):
        if f.name in model:
            problem = _bad_value(f.name, model[f.name], hints[f.name])
            if problem is not None:
                raise SlimeHydraError(
                    f"model.{f.name}={model[f.name]!r} {problem}; set model.{f.name} to a valid "
                    "value (conf/model/tiny.yaml shows one of each)."
                )


def model_dims(model: Mapping[str, Any]) -> ModelDims:
    """The dims a conf/model mapping describes: with model.path, its config.json's (the dims
    given beside it are replaced, unknown keys still named), else the mapping's own; each value
    checked before the dims are built."""
    if isinstance(model, DictConfig):
        model = OmegaConf.to_container(model, resolve=True)
    if model.get("path"):
        model = {**model, **HfCheckpoint.open(model["path"]).dims()}
    check_model_values(model)
    return ModelDims.from_mapping(model)


def check_tensor_parallel(dims: ModelDims, tp: int) -> None:
    """megatron's own rule, checked before anything runs: tensor parallelism splits the
    attention heads, the key/value groups and the MLP width evenly across its ranks."""
    for key in ("num_attention_heads", "num_query_groups", "ffn_hidden_size"):
        value = getattr(dims, key)
        if value % tp:
            raise SlimeHydraError(
                f"model.{key}={value} does not split over parallel.tp={tp} tensor-parallel "
                f"ranks (megatron divides it evenly); set parallel.tp to a divisor of {value}."
            )


def check_model_source(dims: ModelDims, tokenizer: str | None, export_hf: bool) -> None:
    """The weights a trainer will load, the tokenizer the rollout came from, the export."""
    if dims.path is None:
        if dims.require_path:
            raise SlimeHydraError(
                f"model {dims.name} is post-trained from real weights, and model.path is not "
                "set: add model.path=/path/to/checkpoint (a Hugging Face dir with config.json, "
                "*.safetensors and the tokenizer, e.g. Qwen2.5-7B-Instruct for +exp=grpo_7b). "
                "trainer=plan simulates the run's schedule and needs no weights."
            )
        if export_hf and not (
            dims.swiglu and dims.normalization == "RMSNorm" and dims.add_qkv_bias
        ):
            raise SlimeHydraError(
                f"trainer.export_hf=true writes a Qwen2 checkpoint, but model {dims.name} is "
                "not Qwen2-shaped (swiglu, RMSNorm, add_qkv_bias); drop trainer.export_hf."
            )
        return
    ckpt = HfCheckpoint.open(dims.path)
    ckpt.check_weights()
    if tokenizer:
        from slime_hydra.hf.tokenizer import check_tokenizer_matches

        check_tokenizer_matches(tokenizer, ckpt)
