"""Read an offline run's .wandb file: wandb 0.31 ships no Python reader, so the tests parse it.

The file is a leveldb-style log: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
records, each with a 7-byte header (crc32, little-endian length, type: full/first/middle/last)
and a chunk of a protobuf `wandb_internal_pb2.Record`; a record may span blocks.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

FILE_HEADER = 7
BLOCK = 32 * 1024
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    """Every Record in the file, in order."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a .wandb file"
    out, pos, parts = [], FILE_HEADER, b""
    while pos + RECORD_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < RECORD_HEADER:
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        chunk = data[pos + RECORD_HEADER : pos + RECORD_HEADER + length]
        pos += RECORD_HEADER + length
        if kind == 0 and length == 0:  # zero padding at a block's end
            continue
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def _items(items: Any) -> dict[str, Any]:
    """Key → decoded JSON value of history or summary items (nested keys joined by '/')."""
    return {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in items}


@dataclass
class OfflineRun:
    """What a test checks of a run: its identity, config, history rows and summary."""

    run_id: str = ""
    group: str = ""
    name: str = ""
    job_type: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exited: bool = False


def read_run(path: Path) -> OfflineRun:
    """The run recorded in one .wandb file."""
    run = OfflineRun()
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.group = record.run.run_id, record.run.run_group
            run.name, run.job_type = record.run.display_name, record.run.job_type
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "summary":
            run.summary.update(_items(record.summary.update))
        elif kind == "exit":
            run.exited = True
    return run


def wandb_files(root: Path) -> list[Path]:
    """Every .wandb file under `root`."""
    return sorted(root.rglob("*.wandb"))
