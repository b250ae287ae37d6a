"""Start the workers from inside the Hydra job through torch's elastic launcher (torchrun's
machinery): one node, `trainer.nproc_per_node` processes, a fresh rendezvous per job."""

from __future__ import annotations

import logging
import socket
import uuid
from typing import TYPE_CHECKING

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from slime_hydra.errors import SlimeHydraError
from slime_hydra.train.job import Job
from slime_hydra.train.worker import train

if TYPE_CHECKING:
    from slime_hydra.train.trainer import CpuTrainer

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(trainer: CpuTrainer, job: Job) -> None:
    """Run `train(trainer, job)` in nproc_per_node workers; restart them up to max_restarts."""
    port = free_port()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=trainer.num_procs(job),
        run_id=f"slime_hydra-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port}",
        max_restarts=trainer.max_restarts,
        monitor_interval=0.2,
    )
    log.info(
        "Launching %d %s workers (rendezvous 127.0.0.1:%d, max_restarts=%d)",
        trainer.num_procs(job),
        trainer.backend,
        port,
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
