"""The Sink protocol every metrics destination implements."""

from __future__ import annotations

from typing import Any, Protocol

Metrics = dict[str, Any]


class Sink(Protocol):
    """Receives one dict of metrics per training step (with a `step` key), then `close()`."""

    def log(self, metrics: Metrics) -> None: ...

    def close(self) -> None: ...


class NoSink:
    """The `logger=jsonl` choice: nothing beyond the always-on metrics.jsonl."""

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
