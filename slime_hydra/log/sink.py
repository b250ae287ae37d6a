"""The Sink protocol every metrics destination implements."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from slime_hydra.schedule import Schedule

Metrics = dict[str, Any]


@dataclass(frozen=True)
class RunInfo:
    """Who this run is, read from Hydra in the launching process and handed to every sink, so
    that worker processes (which have no Hydra context) log under the same identity."""

    run_dir: Path
    config: dict[str, Any]
    """The resolved job config."""
    name: str
    """The job's overrides (or 'run' when there are none)."""
    group: str | None
    """The sweep dir name in a multirun, else None."""
    job_type: str
    """The trainer mode: plan, cpu or gpu."""


class Sink(Protocol):
    """Receives one dict of metrics per training step (with a `step` key, counted from 1), then
    `close()`.

    The `logger` group's `_target_` is built with `run=` (a RunInfo) and `schedule=` (the run's
    Schedule, or None) besides its config keys (slime_hydra/log/sinks.py).
    """

    def log(self, metrics: Metrics) -> None: ...

    def close(self) -> None: ...


class NoSink:
    """A sink that drops everything: the `logger=jsonl` choice (nothing beyond the always-on
    metrics.jsonl), and every rank's but the one that logs, so that the code that logs has no
    `if sink is not None` (torchtitan's pattern)."""

    def __init__(self, run: RunInfo | None = None, schedule: Schedule | None = None) -> None:
        del run, schedule

    def log(self, metrics: Metrics) -> None:
        """Drop the metrics."""

    def close(self) -> None:
        """Nothing to close."""


class FanOut:
    """Sends every step's metrics to several sinks, in order."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    def log(self, metrics: Metrics) -> None:
        """Log to each sink."""
        for sink in self.sinks:
            sink.log(metrics)

    def close(self) -> None:
        """Close each sink."""
        for sink in self.sinks:
            sink.close()
