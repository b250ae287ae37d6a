"""Start the workers from inside the Hydra job through torch's elastic launcher (torchrun's
machinery): `trainer.nproc_per_node` processes on each node of the job (train/nodes.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from slime_hydra.errors import SlimeHydraError
from slime_hydra.train.job import Job
from slime_hydra.train.nodes import job_nodes
from slime_hydra.train.worker import train

if TYPE_CHECKING:
    from slime_hydra.train.trainer import CpuTrainer

log = logging.getLogger(__name__)


def launch(trainer: CpuTrainer, job: Job) -> None:
    """Run `train(trainer, job)` in nproc_per_node workers; restart them up to max_restarts."""
    nodes = job_nodes()
    config = LaunchConfig(
        min_nodes=nodes.count,
        max_nodes=nodes.count,
        nproc_per_node=trainer.num_procs(job),
        run_id=nodes.run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=nodes.endpoint,
        max_restarts=trainer.max_restarts,
        monitor_interval=0.2,
    )
    log.info(
        "Launching %d %s workers on node %d of %d (rendezvous %s, max_restarts=%d)",
        trainer.num_procs(job),
        trainer.backend,
        nodes.rank,
        nodes.count,
        nodes.endpoint,
        trainer.max_restarts,
    )
    try:
        elastic_launch(config, train)(trainer, job)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise SlimeHydraError(
            f"training failed on rank {rank} (exit code {failure.exitcode}): "
            f"{failure.message or 'see its traceback above'}"
        ) from None
