"""What a trainer checks about the model's source before any worker starts: the checkpoint
(config.json, every weight's shape), the tokenizer against it, and whether an export can be
written. Torch-free; the tokenizer check imports transformers only when data has a tokenizer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checkpoint import HfCheckpoint
from slime_hydra.schedule.cost import ModelDims


def model_dims(model: Mapping[str, Any]) -> ModelDims:
    """The dims a conf/model mapping describes: with model.path, its config.json's (the dims
    given beside it are replaced, unknown keys still named), else the mapping's own."""
    if isinstance(model, DictConfig):
        model = OmegaConf.to_container(model, resolve=True)
    if model.get("path"):
        model = {**model, **HfCheckpoint.open(model["path"]).dims()}
    return ModelDims.from_mapping(model)


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
