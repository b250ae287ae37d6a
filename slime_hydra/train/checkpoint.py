"""Checkpoints in <run dir>/checkpoints: one file per rank per saved step, and `latest`.

`step_NNNNNN/rank_RRR.pt` holds that rank's model and optimizer state, its RNG state, the
number of steps done (NNNNNN) and a digest of the schedule. `latest` names the last step all
ranks finished saving, so a worker killed mid-save leaves the previous checkpoint in force.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Any

import torch

from slime_hydra.errors import SlimeHydraError
from slime_hydra.schedule import Schedule


def checkpoint_root(run_dir: Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(run_dir) / "checkpoints"


def _rank_file(run_dir: Path, steps_done: int, rank: int) -> Path:
    return checkpoint_root(run_dir) / f"step_{steps_done:06d}" / f"rank_{rank:03d}.pt"


def schedule_digest(schedule: Schedule) -> str:
    """A short fingerprint of the schedule, so a resume can refuse a different one."""
    return hashlib.sha256(json.dumps(schedule.to_json()).encode()).hexdigest()[:16]


def latest_step(run_dir: Path) -> int | None:
    """Steps done at the last complete checkpoint, or None when there is none."""
    path = checkpoint_root(run_dir) / "latest"
    return int(path.read_text()) if path.is_file() else None


def _write_atomic(path: Path, write: Any) -> None:
    """Write to a temporary name, then rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save(
    run_dir: Path,
    steps_done: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: Any,
    digest: str,
) -> None:
    """Save this rank's state after `steps_done` steps (every rank, before `mark_latest`)."""
    path = _rank_file(run_dir, steps_done, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "steps_done": steps_done,
        "schedule": digest,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    _write_atomic(path, lambda tmp: torch.save(state, tmp))


def mark_latest(run_dir: Path, steps_done: int) -> None:
    """Point `latest` at a checkpoint every rank has saved (rank 0, after a barrier)."""
    _write_atomic(
        checkpoint_root(run_dir) / "latest", lambda tmp: tmp.write_text(f"{steps_done}\n")
    )


def load(run_dir: Path, rank: int, model: torch.nn.Module, optimizer: Any, digest: str) -> int:
    """Restore this rank from the latest checkpoint; return the steps done (the next step)."""
    steps_done = latest_step(run_dir)
    if steps_done is None:
        raise SlimeHydraError(f"{checkpoint_root(run_dir)} holds no checkpoint to resume from.")
    path = _rank_file(run_dir, steps_done, rank)
    if not path.is_file():
        raise SlimeHydraError(
            f"{path} is missing: the checkpoint was saved by fewer ranks; resume with the same "
            "parallel.* sizes and process count as the run that saved it."
        )
    state = torch.load(path, weights_only=False)
    if state["schedule"] != digest:
        raise SlimeHydraError(
            f"the checkpoint in {path.parent} was trained on a different schedule; resume with "
            "the same data, batching and parallel config (the run dir's config.yaml)."
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return steps_done


def truncate_metrics(path: Path, steps_done: int) -> None:
    """Keep only metrics.jsonl rows of steps before `steps_done`, so no step is logged twice."""
    if not path.is_file():
        return
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    kept = [line for line in rows if json.loads(line)["step"] < steps_done]
    _write_atomic(path, lambda tmp: tmp.write_text("".join(f"{line}\n" for line in kept)))
