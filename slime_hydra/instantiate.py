"""Building objects from `_target_` config nodes, with our errors surfacing unwrapped.

Its own module (only hydra and errors below it), so that config validation, the log sinks and
the app all build objects one way without importing each other.
"""

from __future__ import annotations

import logging
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from slime_hydra.errors import SlimeHydraError

log = logging.getLogger("slime_hydra.config")


def factory(node: DictConfig) -> Any:
    """Instantiate a `_target_` node partially: a callable that takes the runtime arguments
    (kept as objects, not converted to config), surfacing our errors unwrapped. Its settings are
    plain Python values (`_convert_="all"`), so what it builds holds no config tree."""
    log.info("Instantiating <%s>", node._target_)
    try:
        return instantiate(node, _partial_=True, _convert_="all")
    except InstantiationException as exc:
        if isinstance(exc.__cause__, SlimeHydraError):
            raise exc.__cause__ from None
        raise SlimeHydraError(str(exc)) from None


def build(node: DictConfig, **runtime: Any) -> Any:
    """Instantiate a `_target_` node and call it with the runtime arguments."""
    return factory(node)(**runtime)
