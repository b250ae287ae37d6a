"""Shared fixtures: Hydra composition of the real conf/ with the overrides users type."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from slime_hydra.config import register_configs

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


@pytest.fixture
def compose_cfg() -> Iterator[Callable[..., DictConfig]]:
    """compose_cfg(*overrides, with_hydra=False) -> the composed config (with the `hydra` node
    if asked); Hydra's global state cleared after."""
    register_configs()

    def _compose(*overrides: str, with_hydra: bool = False) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(
                config_name="config", overrides=list(overrides), return_hydra_config=with_hydra
            )

    yield _compose
    GlobalHydra.instance().clear()
