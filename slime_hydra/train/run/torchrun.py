"""What torchrun (or the elastic launcher) tells a worker through its environment; no torch."""

from __future__ import annotations

import os
from dataclasses import dataclass

from slime_hydra.train.run.nodes import node_rank

_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@dataclass(frozen=True)
class TorchrunEnv:
    """This process's place in a torchrun/elastic job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    restart_count: int
    """How often the elastic agent has restarted the workers (0 on the first attempt)."""


def torchrun_env() -> TorchrunEnv | None:
    """The worker environment torchrun sets, or None in a process torchrun did not start."""
    if not all(name in os.environ for name in _ENV):
        return None
    return TorchrunEnv(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ["LOCAL_RANK"]),
        local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    )


def is_rank_zero() -> bool:
    """The process that writes run files: global rank 0 under torchrun, else the job process
    of the first node (every node's job process plans, on a multi-node SLURM job)."""
    env = torchrun_env()
    return node_rank() == 0 if env is None else env.rank == 0
