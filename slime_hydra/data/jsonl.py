"""Length traces in JSON Lines: one object per sample, for planning from real rollout logs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError


def _positive_int(record: dict, key: str, at: str) -> int:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SlimeHydraError(f"{at}: {key}={value!r} is not a positive integer.")
    return value


@dataclass(frozen=True)
class JsonlTrace:
    """Reads `total_length` (required), `response_length`, `group` and `step` per line.

    A sample without `group` is its own group; `step`, when every line has it, fixes the steps.
    """

    path: str

    def load(self) -> RolloutBatch:
        """Parse the file, naming file and line of the first bad record."""
        path = Path(self.path)
        if not path.is_file():
            raise SlimeHydraError(f"data.path={self.path!r} is not a file.")
        total, response, groups, steps = [], [], [], []
        with path.open() as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                at = f"{path}:{lineno}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise SlimeHydraError(f"{at}: not valid JSON ({exc.msg}).") from None
                if not isinstance(record, dict) or "total_length" not in record:
                    raise SlimeHydraError(
                        f"{at}: each line must be a JSON object with a total_length field."
                    )
                n = _positive_int(record, "total_length", at)
                total.append(n)
                response.append(
                    _positive_int(record, "response_length", at)
                    if "response_length" in record
                    else n
                )
                groups.append(record.get("group", -len(total)))
                steps.append(record.get("step"))
        if not total:
            raise SlimeHydraError(
                f"{path} holds no samples: the rollout is empty, nothing to schedule."
            )
        has_steps = [s is not None for s in steps]
        if any(has_steps) and not all(has_steps):
            raise SlimeHydraError(
                f"{path}: `step` is on some lines but not all; give it on every line or none."
            )
        return RolloutBatch(
            total_lengths=np.asarray(total, dtype=np.int64),
            response_lengths=np.asarray(response, dtype=np.int64),
            group_ids=np.asarray(groups, dtype=np.int64),
            step_ids=np.asarray(steps, dtype=np.int64) if all(has_steps) else None,
        )
