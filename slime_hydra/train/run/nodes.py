"""Which nodes a job's workers span: this one alone, or every node of a SLURM allocation.

Under SLURM with several nodes (sbatch, or Hydra's submitit launcher with one task per node),
each node's job process hands its GPUs to the elastic launcher, and the launchers meet at a
c10d rendezvous on the allocation's first node: the torchrun hand-off, without torchrun.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slime_hydra.train.job import Job
    from slime_hydra.train.settings import CpuTrainer

SLURM_RDZV_PORT = 29500


@dataclass(frozen=True)
class Nodes:
    """How many nodes, this node's rank among them, and where their launchers meet."""

    count: int
    rank: int
    endpoint: str
    run_id: str


def first_host(nodelist: str) -> str:
    """The first hostname of a SLURM node list such as 'gpu[003-005,9],login1' → 'gpu003'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"cannot read SLURM node list {nodelist!r}")
    prefix, ranges = match.groups()
    return prefix if ranges is None else prefix + re.split(r"[-,]", ranges)[0]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_count() -> int:
    """Nodes the job's workers span: the SLURM allocation's (with its node list), else 1."""
    if "SLURM_JOB_NODELIST" not in os.environ:
        return 1
    return int(os.environ.get("SLURM_NNODES", "1"))


def node_rank() -> int:
    """This node's rank within the job (0 on a single node)."""
    return int(os.environ.get("SLURM_NODEID", "0")) if node_count() > 1 else 0


def job_nodes() -> Nodes:
    """All nodes of a multi-node SLURM job, else this node alone with a fresh local rendezvous."""
    count = node_count()
    if count > 1:
        return Nodes(
            count=count,
            rank=node_rank(),
            endpoint=f"{first_host(os.environ['SLURM_JOB_NODELIST'])}:{SLURM_RDZV_PORT}",
            run_id=f"slime_hydra-slurm-{os.environ.get('SLURM_JOB_ID', 'job')}",
        )
    return Nodes(1, 0, f"127.0.0.1:{free_port()}", f"slime_hydra-{uuid.uuid4().hex[:8]}")


def num_procs(trainer: CpuTrainer, job: Job) -> int:
    """Workers to start on this node: trainer.nproc_per_node, or the world size over the nodes."""
    if trainer.nproc_per_node is None:
        return job.layout.world_size // node_count()
    return trainer.nproc_per_node
