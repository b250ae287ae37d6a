"""A logger that fails as third-party code does (not with our error), for sweep fault tests."""

from __future__ import annotations

from slime_hydra.log.sink import Metrics, RunInfo
from slime_hydra.schedule import Schedule


class BrokenSink:
    """Raises RuntimeError when built for a run whose seed is 2; logs nothing otherwise."""

    def __init__(self, run: RunInfo, schedule: Schedule | None = None) -> None:
        if run.config.get("seed") == 2:
            raise RuntimeError("the logger's service is down")

    def log(self, metrics: Metrics) -> None:
        """Drop the row."""

    def close(self) -> None:
        """Nothing to close."""
