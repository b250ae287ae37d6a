"""Checks a training run must pass before any worker starts (`check_training`, then each part
it is made of); plain Python and numpy: torch only where trainer=gpu asks CUDA for its GPUs, and
the resume check's checkpoint reader."""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checks import check_model_source
from slime_hydra.schedule import BatchingStrategy, ParallelLayout, Schedule
from slime_hydra.schedule.schedule import step_number
from slime_hydra.train.job import Job
from slime_hydra.train.run.nodes import node_count, num_procs
from slime_hydra.train.run.torchrun import torchrun_env
from slime_hydra.train.settings import CpuTrainer


def check_training(trainer: CpuTrainer, job: Job) -> None:
    """Everything about trainer=cpu|gpu that can be checked before a worker starts."""
    check_knobs(
        "trainer",
        lr=(trainer.lr, 0.0, None),
        weight_decay=(trainer.weight_decay, 0.0, None),
        clip_grad=(trainer.clip_grad, 0.0, None),
        eps_clip=(trainer.eps_clip, 0.0, 1.0),
        eps_clip_high=(trainer.eps_clip_high, 0.0, None),
        max_restarts=(trainer.max_restarts, 0, None),
        nproc_per_node=(trainer.nproc_per_node, 1, None),
    )
    check_model_source(job.dims, job.tokenizer, trainer.export_hf)
    check_devices(trainer, job)
    check_vpp(job.layout, job.schedule)
    check_model_split(job.layout, job.dims.num_layers)
    env = torchrun_env()
    if env is None:
        nodes, procs = node_count(), num_procs(trainer, job)
        source = f"trainer.nproc_per_node={procs} on {nodes} node(s)"
        check_world_size(job.layout, procs * nodes, source)
    else:
        check_world_size(job.layout, env.world_size, f"torchrun (WORLD_SIZE={env.world_size})")
    check_trainable(job.schedule, job.strategy)
    check_steps(
        trainer.num_steps(job), trainer.save_interval, trainer.max_steps, trainer.fail_at_step
    )
    model = dataclasses.asdict(job.dims)
    procs = env.local_world_size if env is not None else num_procs(trainer, job)
    check_rollout_fits(job.rollout, model, procs)
    if trainer.resume or (env is not None and env.restart_count > 0):
        check_resume(trainer, job)


def check_resume(trainer: CpuTrainer, job: Job) -> None:
    """The latest checkpoint must be whole (every rank's file loads, weights only), belong to
    this schedule and fit this run's model; on a plain resume there must be one."""
    from slime_hydra.train.run.checkpoint import checkpoint_root, schedule_digest, verify

    fused_norms = False
    if trainer.device == "cuda":
        from slime_hydra.train.step.model import uses_transformer_engine

        fused_norms = uses_transformer_engine("cuda")
    run_dir = job.run.run_dir
    digest = schedule_digest(job.schedule)
    master_copies = trainer.device == "cuda" and trainer.params_dtype != "float32"
    steps_done = verify(run_dir, digest, job.layout, job.dims, fused_norms, master_copies)
    if steps_done is None and trainer.resume:
        raise SlimeHydraError(
            f"trainer.resume=true but {checkpoint_root(run_dir)} holds no checkpoint: pass "
            "the earlier run's hydra.run.dir, or drop trainer.resume (and the run dir)."
        )


def check_devices(trainer: CpuTrainer, job: Job) -> None:
    """What this machine's devices and the layers it builds cannot run (checked first, before
    the world size): megatron's local layers on CPU; on trainer=gpu, CUDA with a GPU per local
    rank first (a machine without GPUs hears that first), then its layers."""
    if trainer.device == "cpu":
        check_sequence_parallel(job.layout, transformer_engine=False)
        return
    import torch

    from slime_hydra.train.step.model import has_transformer_engine

    if not torch.cuda.is_available():
        layout = job.layout
        raise SlimeHydraError(
            f"trainer=gpu needs {layout.world_size} CUDA GPUs (parallel.dp×tp×pp×cp = "
            f"{layout.dp}×{layout.tp}×{layout.pp}×{layout.cp}) with NCCL, and this machine has "
            "none. trainer=plan simulates this layout's "
            "schedule on CPU; trainer=cpu trains the tiny model on CPU ranks."
        )
    env = torchrun_env()
    local = env.local_world_size if env is not None else num_procs(trainer, job)
    check_gpu_count(job.layout, local, torch.cuda.device_count())
    check_sequence_parallel(job.layout, has_transformer_engine())
    if trainer.use_distributed_optimizer and (trainer.resume or trainer.max_restarts):
        raise SlimeHydraError(
            "trainer.use_distributed_optimizer=true shards Adam's state over the DP ranks, "
            "which this project's checkpoints do not save yet, so a resume or an elastic "
            "restart would silently restart it: set trainer.use_distributed_optimizer=false, "
            "or trainer.resume=false and trainer.max_restarts=0."
        )


def check_world_size(layout: ParallelLayout, world_size: int, source: str) -> None:
    """The process count must equal dp × tp × pp × cp."""
    if world_size != layout.world_size:
        raise SlimeHydraError(
            f"{source} gives {world_size} processes, but parallel.dp×tp×pp×cp = "
            f"{layout.dp}×{layout.tp}×{layout.pp}×{layout.cp} = {layout.world_size}: set "
            f"trainer.nproc_per_node={layout.world_size} (or torchrun's --nproc-per-node × "
            "--nnodes), or change parallel.dp/tp/pp/cp to match."
        )


def check_sequence_parallel(layout: ParallelLayout, transformer_engine: bool) -> None:
    """Sequence parallelism needs Transformer Engine's layers: megatron-core's local layers,
    which trainer=cpu and a GPU without TE build, refuse it (their torch norm asserts
    sequence_parallel=false, megatron/core/transformer/torch_norm.py)."""
    if layout.sequence_parallel and not transformer_engine:
        raise SlimeHydraError(
            "parallel.sequence_parallel=true needs Transformer Engine's layers, and this run "
            "would build megatron-core's local ones (trainer=cpu always does; trainer=gpu does "
            "where transformer_engine cannot be imported), whose torch RMSNorm/LayerNorm refuses "
            "sequence parallelism. Set parallel.sequence_parallel=false (the same math, with "
            "activations replicated over the TP ranks instead of split), use trainer=gpu on "
            "machines with transformer_engine installed, or trainer=plan to simulate this layout."
        )


def check_model_split(layout: ParallelLayout, num_layers: int) -> None:
    """Every pipeline stage's VPP chunk holds the same whole number of layers."""
    chunks = layout.pp * layout.vpp
    if num_layers % chunks:
        raise SlimeHydraError(
            f"model.num_layers={num_layers} does not split into parallel.pp×vpp = "
            f"{layout.pp}×{layout.vpp} = {chunks} equal model chunks: set model.num_layers to a "
            f"multiple of {chunks} (e.g. model.num_layers={chunks * -(-num_layers // chunks)}), "
            "or change parallel.pp/vpp."
        )


def check_vpp(layout: ParallelLayout, schedule: Schedule) -> None:
    """megatron-core 0.16's interleaved schedule: PP ≤ group ≤ M, and M % group is 0 or ≥ PP."""
    if layout.vpp == 1:
        return
    pp, group = layout.pp, layout.vp_group_size
    for st in schedule.steps:
        m = st.num_microbatches
        if not pp <= group <= m or 0 < m % group < pp:
            raise SlimeHydraError(
                f"step {step_number(st.step)}: {m} micro-batches per rank with "
                f"parallel.pp={pp} and parallel.microbatch_group_size_per_vp_stage={group}; "
                "megatron-core's interleaved schedule needs pp ≤ group ≤ micro-batches and "
                "micro-batches % group equal to 0 or ≥ pp. Lower "
                "parallel.microbatch_group_size_per_vp_stage, lower batching.max_tokens_per_gpu "
                "(more micro-batches), or raise batching.global_batch_size."
            )


def check_trainable(schedule: Schedule, strategy: BatchingStrategy) -> None:
    """Refuse a schedule with an empty micro-batch: a rank would have nothing to run."""
    for st in schedule.steps:
        for r, rank in enumerate(st.ranks):
            for m, mb in enumerate(rank):
                if not mb:
                    raise SlimeHydraError(
                        f"batching={strategy.name} left micro-batch {m} of DP rank {r} empty "
                        f"at step {step_number(st.step)} (slime issue #1838), which training "
                        "cannot run; trainer=plan measures this preset, or use "
                        "batching=dynamic to train."
                    )


def check_steps(
    num_steps: int, save_interval: int | None, max_steps: int | None, fail_at_step: int | None
) -> None:
    """Step counts in the trainer config must be positive, and a step number (counted from 1)
    one of the run's steps 1..num_steps."""
    for name, value in (("save_interval", save_interval), ("max_steps", max_steps)):
        if value is not None and value < 1:
            raise SlimeHydraError(f"trainer.{name}={value} must be a positive number of steps.")
    if fail_at_step is not None and not 1 <= fail_at_step <= num_steps:
        raise SlimeHydraError(
            f"trainer.fail_at_step={fail_at_step} is not one of the run's steps 1..{num_steps} "
            "(steps count from 1): set trainer.fail_at_step to one of them, or to null."
        )


def check_knobs(
    prefix: str, **knobs: tuple[float | int | None, float | None, float | None]
) -> None:
    """Each `name=(value, low, high)`: a finite number with low ≤ value (< high when given);
    None values are unset options and pass."""
    for name, (value, low, high) in knobs.items():
        if value is None:
            continue
        bad = isinstance(value, bool) or not math.isfinite(value)
        bad = bad or (low is not None and value < low) or (high is not None and value >= high)
        if bad:
            where = f"at least {low}" if high is None else f"in [{low}, {high})"
            raise SlimeHydraError(f"{prefix}.{name}={value} must be a finite number {where}.")


def check_gpu_count(layout: ParallelLayout, local_procs: int, device_count: int) -> None:
    """Each worker on this node needs its own GPU."""
    if local_procs > device_count:
        raise SlimeHydraError(
            f"trainer=gpu starts {local_procs} workers on this node, one per GPU, but it has "
            f"{device_count} CUDA GPU(s) (parallel.dp×tp×pp×cp = {layout.dp}×{layout.tp}×"
            f"{layout.pp}×{layout.cp} = {layout.world_size} over the nodes). Shrink the layout, "
            "run on more nodes (hydra/launcher=slurm hydra.launcher.nodes=N), or simulate it "
            "with trainer=plan."
        )


BYTES_PER_TOKEN = 64
"""Host memory per rollout token while workers start: the flat token buffers and their
temporaries (data/tokens.py), in the job process and a copy in each worker."""


def physical_memory() -> int | None:
    """Bytes of RAM on this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def check_rollout_fits(rollout: RolloutBatch, model: dict, procs: int) -> None:
    """What the trainer would allocate from the rollout: every sample within the model's
    positions, all token buffers within this machine's memory, every token id in the vocab."""
    lengths = np.asarray(rollout.total_lengths, dtype=np.int64)
    positions = model.get("max_position_embeddings")
    if positions is not None and lengths.size and int(lengths.max()) > positions:
        i = int(lengths.argmax())
        raise SlimeHydraError(
            f"sample {i} has {int(lengths[i]):,} tokens, more than the model's "
            f"model.max_position_embeddings={positions}, so training cannot run it. Drop or "
            "truncate such samples in the rollout, or train a model with a longer context."
        )
    memory = physical_memory()
    need = int(lengths.sum(dtype=np.float64)) * BYTES_PER_TOKEN * (procs + 1)
    if memory is not None and need > memory:
        raise SlimeHydraError(
            f"the rollout holds {int(lengths.sum(dtype=np.float64)):,} tokens: their buffers in "
            f"the job and {procs} worker(s) need about {need / 2**30:,.0f} GiB, and this "
            f"machine has {memory / 2**30:,.0f} GiB. Check the rollout's total_length values, "
            "or train it in smaller parts."
        )
    vocab = model.get("vocab_size")
    tokens = rollout.tokens
    if vocab is None or tokens is None or not len(tokens.tokens):
        return
    bad = np.flatnonzero((tokens.tokens < 0) | (tokens.tokens >= vocab))
    if bad.size:
        j = int(bad[0])
        i = int(np.searchsorted(tokens.offsets, j, side="right")) - 1
        at = j - int(tokens.offsets[i])
        raise SlimeHydraError(
            f"sample {i} holds token id {int(tokens.tokens[j])} (position {at}), outside the "
            f"model's vocabulary [0, model.vocab_size={vocab}); "
            f"{bad.size} token(s) are out of range. Use the model the rollout was tokenized for "
            "(model.vocab_size, or model=hf model.path=...)."
        )
