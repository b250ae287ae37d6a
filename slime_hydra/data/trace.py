"""Length traces (JSON Lines or Parquet): one record per sample, for planning from real logs.

Each record has `total_length` (required) and optionally `response_length`, `group` and `step`,
all integers (int64; a float or a string is an error naming file and line, never rounded, so
group ids 0.3 and 0.7 cannot merge). A sample without `group` is its own group (an id no explicit
group uses); `step`, a non-negative integer, when every record has it, fixes the steps.
Tokens are not part of a trace: a trainer synthesises them from the lengths.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import json_lines, parquet_rows

INT64 = (-(2**63), 2**63 - 1)


def integer(value: object, key: str, at: str, low: int | None = None) -> int:
    """`value` as an int64 (at least `low`), or an error naming where, the value and the fix."""
    what = "an integer" if low is None else f"an integer ≥ {low}"
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SlimeHydraError(
            f"{at}: {key}={value!r} is not {what}; write it as a JSON/Parquet integer "
            "(floats and strings are not rounded or mapped)."
        )
    number = int(value)
    if not INT64[0] <= number <= INT64[1]:
        raise SlimeHydraError(f"{at}: {key}={number} does not fit a 64-bit integer.")
    if low is not None and number < low:
        raise SlimeHydraError(f"{at}: {key}={number} is not {what}.")
    return number


def _positive_int(record: dict, key: str, at: str) -> int:
    return integer(record[key], key, at, low=1)


def _existing(path: str) -> Path:
    if not Path(path).is_file():
        raise SlimeHydraError(f"data.path={path!r} is not a file.")
    return Path(path)


def records_to_batch(records: Iterable[tuple[str, object]], source: Path) -> RolloutBatch:
    """Validate (where, record) pairs into a RolloutBatch, naming the first bad record."""
    total, response, groups, steps = [], [], [], []
    for at, record in records:
        if not isinstance(record, dict) or "total_length" not in record:
            raise SlimeHydraError(f"{at}: each record must be an object with a total_length field.")
        n = _positive_int(record, "total_length", at)
        total.append(n)
        has_response = record.get("response_length") is not None
        response.append(_positive_int(record, "response_length", at) if has_response else n)
        if response[-1] > n:
            raise SlimeHydraError(
                f"{at}: response_length={response[-1]} is more than total_length={n}; the "
                "response is part of the sample's tokens, so it cannot be longer than all of them."
            )
        group = record.get("group")
        groups.append(None if group is None else integer(group, "group", at))
        step = record.get("step")
        steps.append(None if step is None else integer(step, "step", at, low=0))
    if not total:
        raise SlimeHydraError(
            f"{source} holds no samples: the rollout is empty, nothing to schedule."
        )
    has_steps = [s is not None for s in steps]
    if any(has_steps) and not all(has_steps):
        raise SlimeHydraError(
            f"{source}: `step` is on some records but not all; give it on every one or none."
        )
    return RolloutBatch(
        total_lengths=np.asarray(total, dtype=np.int64),
        response_lengths=np.asarray(response, dtype=np.int64),
        group_ids=_fill_groups(groups, source),
        step_ids=np.asarray(steps, dtype=np.int64) if all(has_steps) else None,
    )


def _fill_groups(groups: list[int | None], source: Path) -> np.ndarray:
    """Group ids with each ungrouped sample (None) in a group of its own, numbered above every
    explicit id so that none collides with one (e.g. with an explicit group -1)."""
    explicit = [g for g in groups if g is not None]
    first = max(explicit, default=-1) + 1
    ungrouped = len(groups) - len(explicit)
    if ungrouped and first + ungrouped - 1 > INT64[1]:
        raise SlimeHydraError(
            f"{source}: some records have no group and the explicit group ids reach {first - 1}, "
            "leaving no free id for them; give every record a group or use smaller ids."
        )
    fresh = iter(range(first, first + len(groups)))
    return np.asarray([next(fresh) if g is None else g for g in groups], dtype=np.int64)


@dataclass(frozen=True)
class JsonlTrace:
    """A trace in JSON Lines: one object per line; blank lines are skipped."""

    path: str

    def load(self) -> RolloutBatch:
        """Parse the file, naming file and line of the first bad record."""
        path = _existing(self.path)
        return records_to_batch(json_lines(path), path)


@dataclass(frozen=True)
class ParquetTrace:
    """A trace in Parquet: one row per sample, the fields as columns."""

    path: str

    def load(self) -> RolloutBatch:
        """Read the table, naming file and row of the first bad record."""
        path = _existing(self.path)
        return records_to_batch(parquet_rows(path), path)
