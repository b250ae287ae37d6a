"""One-process megatron parallel state (gloo, world size 1) for unit tests that build megatron
modules in the test process: torch's distributed group and megatron's TP/PP/CP/DP groups."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

import torch.distributed as dist


@contextlib.contextmanager
def single_rank() -> Iterator[None]:
    """The trainer's own `init_distributed` on one gloo process; torn down after."""
    from slime_hydra.train.run.distributed import destroy_distributed, init_distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        init_distributed()
        yield
    finally:
        if dist.is_initialized():
            destroy_distributed()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
