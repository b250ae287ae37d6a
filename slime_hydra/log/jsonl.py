"""metrics.jsonl: one JSON object per step, flushed as it goes so a crash loses nothing logged."""

from __future__ import annotations

import json
from pathlib import Path

from slime_hydra.log.sink import Metrics


class JsonlSink:
    """Appends each step's metrics as one line of JSON to `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = self.path.open("a")

    def log(self, metrics: Metrics) -> None:
        """Write one line and flush it."""
        self._file.write(json.dumps(metrics) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()
