"""trainer=cpu and trainer=gpu: their settings, the checks before launch, and the hand-off to
worker processes (started by the elastic launcher here, or already started by torchrun).

Torch is imported only when a run starts, so composing configs and `trainer=plan` stay light.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import ClassVar

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import synthesize_tokens
from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checks import check_model_source
from slime_hydra.train.checks import (
    check_gpu_count,
    check_knobs,
    check_model_split,
    check_rollout_fits,
    check_sequence_parallel,
    check_steps,
    check_trainable,
    check_vpp,
    check_world_size,
)
from slime_hydra.train.job import Job
from slime_hydra.train.nodes import node_count
from slime_hydra.train.torchrun import torchrun_env

log = logging.getLogger(__name__)


@dataclass
class CpuTrainer:
    """Train the policy with megatron-core on CPU ranks over gloo: every layout (dp, tp, pp, vpp,
    cp) through the same megatron schedules, DDP and loss as trainer=gpu, in float32."""

    nproc_per_node: int | None = None
    """Workers the launcher starts per node; null: the layout's dp × tp × pp × cp over the nodes."""
    lr: float = 1e-3
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    clip_grad: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    eps_clip: float = 0.2
    """PPO ratio clip below 1."""
    eps_clip_high: float = 0.28
    """PPO ratio clip above 1."""
    max_steps: int | None = None
    """Train only the first max_steps steps of the schedule; null means all of them."""
    save_interval: int | None = None
    """Checkpoint after every step k that is a multiple of save_interval (its dir is named k,
    steps counting from 1), and always after the last step."""
    resume: bool = False
    """Continue from the run dir's last checkpoint (pass the same hydra.run.dir)."""
    max_restarts: int = 0
    """Times the elastic launcher restarts failed workers; they resume from the last checkpoint."""
    fail_at_step: int | None = None
    """Fault injection for tests: the last rank exits at the start of this step (counted from 1,
    as in metrics.jsonl), first attempt only."""
    skip_nonfinite: bool = False
    """A step whose loss or gradient norm is not finite stops the run (the last checkpoint is
    kept); true: a step the optimizer skipped is skipped and counted in train/skipped_steps."""
    export_hf: bool = False
    """Write the trained model as a Hugging Face checkpoint, <run dir>/hf/, at every checkpoint
    and at the end (config.json, safetensors, and model.path's tokenizer files)."""

    backend: ClassVar[str] = "gloo"
    device: ClassVar[str] = "cpu"
    params_dtype: ClassVar[str] = "float32"
    use_distributed_optimizer: ClassVar[bool] = False

    def num_procs(self, job: Job) -> int:
        """Workers to start on this node: nproc_per_node, or the world size over the nodes."""
        if self.nproc_per_node is None:
            return job.layout.world_size // node_count()
        return self.nproc_per_node

    def num_steps(self, job: Job) -> int:
        """Steps this run trains: the schedule's, or the first max_steps of them."""
        total = len(job.schedule.steps)
        return total if self.max_steps is None else min(self.max_steps, total)

    def check(self, job: Job) -> None:
        """Everything that can be checked before a worker starts."""
        check_knobs(
            "trainer",
            lr=(self.lr, 0.0, None),
            weight_decay=(self.weight_decay, 0.0, None),
            clip_grad=(self.clip_grad, 0.0, None),
            eps_clip=(self.eps_clip, 0.0, 1.0),
            eps_clip_high=(self.eps_clip_high, 0.0, None),
            max_restarts=(self.max_restarts, 0, None),
            nproc_per_node=(self.nproc_per_node, 1, None),
        )
        check_model_source(job.dims, job.tokenizer, self.export_hf)
        self.check_layout(job)
        check_vpp(job.layout, job.schedule)
        check_model_split(job.layout, job.dims.num_layers)
        from slime_hydra.data.iterator import padding

        padding(job.pad_multiple, job.layout.tp, job.layout.cp)
        env = torchrun_env()
        if env is None:
            nodes, procs = node_count(), self.num_procs(job)
            source = f"trainer.nproc_per_node={procs} on {nodes} node(s)"
            check_world_size(job.layout, procs * nodes, source)
        else:
            check_world_size(job.layout, env.world_size, f"torchrun (WORLD_SIZE={env.world_size})")
        check_trainable(job.schedule, job.strategy)
        check_steps(self.num_steps(job), self.save_interval, self.max_steps, self.fail_at_step)
        model = dataclasses.asdict(job.dims)
        procs = env.local_world_size if env is not None else self.num_procs(job)
        check_rollout_fits(job.rollout, model, procs)
        if self.resume or (env is not None and env.restart_count > 0):
            self.check_resume(job)

    def check_resume(self, job: Job) -> None:
        """The latest checkpoint must be whole (every rank's file loads, weights only) and
        belong to this schedule; on a plain resume there must be one."""
        from slime_hydra.train.checkpoint import checkpoint_root, identity, schedule_digest, verify

        run_dir = job.run.run_dir
        digest, ident = schedule_digest(job.schedule), identity(job.layout, job.dims)
        steps_done = verify(run_dir, job.layout.world_size, digest, ident)
        if steps_done is None and self.resume:
            raise SlimeHydraError(
                f"trainer.resume=true but {checkpoint_root(run_dir)} holds no checkpoint: pass "
                "the earlier run's hydra.run.dir, or drop trainer.resume (and the run dir)."
            )

    def check_layout(self, job: Job) -> None:
        """What megatron's local layers on CPU cannot run (checked first, before the world
        size)."""
        check_sequence_parallel(job.layout, transformer_engine=False)

    def run(self, job: Job) -> None:
        """Give the rollout tokens, then train in torchrun's workers or start our own (the app
        has run `check` before writing the run dir)."""
        job = dataclasses.replace(
            job,
            rollout=with_tokens(job.rollout, job.dims.vocab_size, job.seed),
        )
        if torchrun_env() is not None:
            from slime_hydra.train.worker import train

            train(self, job)
        else:
            from slime_hydra.train.launch import launch

            launch(self, job)


@dataclass
class GpuTrainer(CpuTrainer):
    """Train with megatron-core on NCCL GPUs: the same engine, bf16, TE layers where installed."""

    lr: float = 1e-6
    """AdamW learning rate (constant); lower than the CPU trainer's, for real model sizes."""
    params_dtype: str = "bfloat16"
    """Model weights' dtype: bfloat16, float16 or float32."""
    use_distributed_optimizer: bool = False
    """megatron's distributed optimizer: optimizer state sharded over the DP ranks."""

    backend: ClassVar[str] = "nccl"
    device: ClassVar[str] = "cuda"

    def check_layout(self, job: Job) -> None:
        """CUDA with a GPU per local rank, then what the layers this machine builds cannot
        run (checked first, before the world size): a machine without GPUs hears that first."""
        import torch

        from slime_hydra.train.model import has_transformer_engine

        if not torch.cuda.is_available():
            layout = job.layout
            raise SlimeHydraError(
                f"trainer=gpu needs {layout.world_size} CUDA GPUs (parallel.dp×tp×pp×cp = "
                f"{layout.dp}×{layout.tp}×{layout.pp}×{layout.cp}) with NCCL, and this machine has "
                "none. trainer=plan simulates this layout's "
                "schedule on CPU; trainer=cpu trains the tiny model on CPU ranks."
            )
        env = torchrun_env()
        local = env.local_world_size if env is not None else self.num_procs(job)
        check_gpu_count(job.layout, local, torch.cuda.device_count())
        check_sequence_parallel(job.layout, has_transformer_engine())
        if self.use_distributed_optimizer and (self.resume or self.max_restarts):
            raise SlimeHydraError(
                "trainer.use_distributed_optimizer=true shards Adam's state over the DP ranks, "
                "which this project's checkpoints do not save yet, so a resume or an elastic "
                "restart would silently restart it: set trainer.use_distributed_optimizer=false, "
                "or trainer.resume=false and trainer.max_restarts=0."
            )


def with_tokens(rollout: RolloutBatch, vocab_size: int, seed: int) -> RolloutBatch:
    """The rollout when it has tokens, else its lengths filled with the synthetic copy task."""
    if rollout.tokens is not None:
        return rollout
    log.info("The rollout has lengths only: synthesizing copy-task tokens (vocab %d)", vocab_size)
    tokens = synthesize_tokens(
        rollout.total_lengths, rollout.response_lengths, rollout.group_ids, vocab_size, seed
    )
    return dataclasses.replace(rollout, tokens=tokens)
