"""metrics.jsonl: one JSON object per step, flushed as it goes so a crash loses nothing logged.

Each step is in the file exactly once: a sink opened after k steps are done (a resume or an
elastic restart from the checkpoint after step k, so the run logs steps k+1, k+2, ...; steps
count from 1) first rewrites the file to the rows of steps 1..k, which it will not log again.
A torn last line (a process killed mid-write) is dropped with a warning; a bad line anywhere
else is an error that names it. A full disk leaves no torn line: the row is written whole or
not at all, and the error says the disk is full.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import append_whole, open_append, parse_json, read_bytes, write_file
from slime_hydra.log.sink import Metrics

log = logging.getLogger(__name__)


def _row(line: bytes) -> tuple[int, str]:
    """(step, text) of one metrics line, or ValueError saying why it is not a row."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"byte 0x{line[exc.start]:02x} at column {exc.start + 1} is not UTF-8"
        ) from None
    try:
        row = parse_json(text, "the line")
    except SlimeHydraError as exc:
        raise ValueError(str(exc).removeprefix("the line: ")) from None
    step = row.get("step") if isinstance(row, dict) else None
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"its step is {step!r}, not an integer")
    return step, text


def rows_done(path: Path, steps_done: int) -> list[str]:
    """The lines of `path` for steps 1..`steps_done` (the last of any repeated step), in step
    order; a torn last line (also one cut inside a UTF-8 character) is skipped. No file: no
    rows; a path that is not a readable file is our error."""
    path = Path(path)
    if not os.path.lexists(path):
        return []
    fix = "repair or remove it, or start a new run dir."
    if path.is_symlink() or not path.is_file():
        raise SlimeHydraError(f"{path} is not a regular file (a dir or a link?); " + fix)
    lines = read_bytes(path, "the metrics file", fix).split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    by_step: dict[int, str] = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            step, text = _row(line)
        except ValueError as exc:
            if i == last:
                log.warning("%s:%d: dropping a torn last line (%s)", path, i + 1, exc)
                continue
            raise SlimeHydraError(
                f"{path}:{i + 1}: not a metrics row ({exc}); the file is damaged before its last "
                "line, so the steps it holds cannot be trusted. Repair or remove that line, or "
                "start a new run dir."
            ) from None
        if step <= steps_done:
            by_step[step] = text
    return [by_step[s] for s in sorted(by_step)]


class JsonlSink:
    """Writes each step's metrics as one line of JSON to `path`, after keeping only the rows of
    steps 1..`steps_done` that the file already holds."""

    def __init__(self, path: str | Path, steps_done: int = 0) -> None:
        self.path = Path(path)
        kept = rows_done(self.path, steps_done)
        if kept or self.path.exists():
            write_file(self.path, "".join(f"{line}\n" for line in kept), self.path.parent)
        self._file = open_append(self.path, self.path.parent)

    def log(self, metrics: Metrics) -> None:
        """Append one line, whole or not at all (a full disk leaves no torn line: our error)."""
        append_whole(self._file, json.dumps(metrics) + "\n", self.path)

    def close(self) -> None:
        """Close the file."""
        self._file.close()
