"""The cost model (schedule/cost.py): model dims from conf/model and FLOPs per sequence."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from slime_hydra.errors import SlimeHydraError
from slime_hydra.schedule.cost import ModelDims, flops_coefficients

MODELS = Path(__file__).resolve().parents[2] / "conf/model"


def test_model_configs_load() -> None:
    for name in ("tiny", "qwen2_5_7b"):
        dims = ModelDims.from_mapping(OmegaConf.load(MODELS / f"{name}.yaml"))
        assert dims.name == name


def test_unknown_model_key_is_named() -> None:
    cfg = {**OmegaConf.to_container(OmegaConf.load(MODELS / "tiny.yaml")), "hiden": 1}
    with pytest.raises(SlimeHydraError, match="hiden"):
        ModelDims.from_mapping(cfg)


def test_missing_model_key_is_named() -> None:
    cfg = OmegaConf.to_container(OmegaConf.load(MODELS / "tiny.yaml"))
    del cfg["hidden_size"]
    with pytest.raises(SlimeHydraError, match="hidden_size"):
        ModelDims.from_mapping(cfg)


def test_flops_coefficients_of_qwen2_5_7b() -> None:
    dims = ModelDims.from_mapping(OmegaConf.load(MODELS / "qwen2_5_7b.yaml"))
    a, b = flops_coefficients(dims)
    # 7.07e9 matmul weights (Qwen2.5-7B: 7.61e9 parameters less the 0.55e9 embedding table).
    matmul_params = 28 * (3584 * (2 * 3584 + 2 * 512) + 3 * 3584 * 18944) + 3584 * 152064
    assert matmul_params == pytest.approx(7.07e9, rel=1e-3)
    assert b == 6 * 28 * 28 * 128
    assert a == 6 * matmul_params + b
