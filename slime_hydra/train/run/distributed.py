"""Process groups and megatron-core model parallelism for torchrun workers, gloo (CPU) or nccl.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `init_distributed`
reads them through torch's `env://` rendezvous. Every layout runs on gloo (CPU) and NCCL alike.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import random as mcore_random

from slime_hydra.errors import SlimeHydraError

_REQUIRED_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def init_distributed(
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    backend: str = "gloo",
    vpp: int = 1,
    timeout_s: float = 600.0,
) -> None:
    """Join the torchrun process group (once) and build megatron's TP/PP/CP/DP groups on it."""
    if backend not in ("gloo", "nccl"):
        raise SlimeHydraError(f"unknown distributed backend {backend!r}: use 'gloo' or 'nccl'")

    if not dist.is_initialized():
        missing = [name for name in _REQUIRED_ENV if name not in os.environ]
        if missing:
            raise SlimeHydraError(
                f"environment variables {', '.join(missing)} are not set: start the trainer "
                "with torchrun (python -m torch.distributed.run --nproc-per-node N ...)."
            )
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        timeout = timedelta(seconds=timeout_s)
        store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
        # The elastic agent keeps one store across restarts: without a per-attempt prefix a
        # restarted worker can read a dead worker's gloo address and fail to connect.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"slime_hydra/attempt_{attempt}", store)
        dist.init_process_group(
            backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )

    world_size = dist.get_world_size()
    model_parallel = tp * pp * cp
    if world_size % model_parallel != 0:
        raise SlimeHydraError(
            f"world size {world_size} is not a multiple of tp×pp×cp = {tp}×{pp}×{cp} = "
            f"{model_parallel}: change parallel.tp/pp/cp or the number of processes "
            "(world size = dp×tp×pp×cp)."
        )
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        context_parallel_size=cp,
    )


def destroy_distributed() -> None:
    """Tear down megatron's groups and the process group; safe to call in a finally-block."""
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


class CpuRNGStatesTracker(mcore_random.CudaRNGStatesTracker):
    """Megatron's named RNG-state tracker on the CPU generator, for code that forks it on CPU."""

    def add(self, name: str, seed: int) -> None:
        """Record a CPU generator state seeded with `seed` under `name`."""
        if seed in self.seeds_:
            raise ValueError(f"RNG seed {seed} is already tracked")
        if name in self.states_:
            raise ValueError(f"RNG state {name!r} is already tracked")
        self._is_initialized = True
        self.seeds_.add(seed)
        self.states_[name] = torch.Generator().manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = mcore_random._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        """Run the body on the named CPU RNG state, then restore the default one."""
        if name not in self.states_:
            raise ValueError(f"RNG state {name!r} is not tracked; call seed_everything first")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def seed_everything(seed: int) -> None:
    """Seed python, torch and megatron's RNG tracker the way model_parallel_cuda_manual_seed does.

    The default torch generator gets the same seed on every rank, so megatron's CPU weight
    initialisation (full master weight, then split) gives identical weights for any tp. On CUDA
    this is megatron's own tracker; on CPU the tracker is a `CpuRNGStatesTracker`.
    """
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        mcore_random.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
        return
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    tracker = CpuRNGStatesTracker()
    tracker.add(mcore_random._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(mcore_random._MODEL_PARALLEL_RNG_TRACKER_NAME, seed + 2718 + tp_rank)
    tracker.add(
        mcore_random._EXPERT_PARALLEL_RNG_TRACKER_NAME, seed + 1024 + 100 * ep_rank + etp_rank
    )
    mcore_random._CUDA_RNG_STATE_TRACKER = tracker
    mcore_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
