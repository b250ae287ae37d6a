"""The trainers' settings: what `trainer=plan|cpu|gpu` composes (config.py derives each
group's schema from these dataclasses) and what the job process hands to every worker. Plain
data, below both halves of train/: run/ reads them to check, launch and loop, and nothing here
starts, checks or imports anything that does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from slime_hydra.train.job import Job


@dataclass
class StepCostSettings:
    """Where the step cost model (schedule/steptime.py) comes from, for every trainer: a
    calibration file, or the uncalibrated analytic model of these two numbers."""

    cost: str | None = None
    """A calibration file (python -m slime_hydra.calibrate writes one) for this layout; null:
    the analytic model of achieved_tflops and microbatch_overhead_ms, uncalibrated."""
    achieved_tflops: float = 400.0
    """Sustained dense TFLOP/s of one GPU (e.g. ~40% of an H100's bf16 peak)."""
    microbatch_overhead_ms: float = 2.0
    """Fixed forward+backward cost of one micro-batch (launches, small matmuls, p2p set-up)."""


@dataclass
class PlanTrainer(StepCostSettings):
    """Logs every step's schedule metrics and its simulated pipeline time, without a model."""

    memory_limit_gib: float | None = 80.0
    """GPU memory a step may use per GPU (against sim/peak_memory_gib, schedule/memory.py); a
    step over it makes the run's objective +inf. 80: an H100's; null: memory is not limited."""
    use_distributed_optimizer: bool = False
    """As trainer=gpu's: the optimizer state is sharded over dp × cp (less memory per GPU)."""


@dataclass
class CpuTrainer(StepCostSettings):
    """Train the policy with megatron-core on CPU ranks over gloo: every layout (dp, tp, pp, vpp,
    cp) through the same megatron schedules, DDP and loss as trainer=gpu, in float32."""

    achieved_tflops: float = 0.05
    """Sustained float32 TFLOP/s of one CPU rank (uncalibrated; trainer.cost for a measured
    model)."""

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
    warmup: bool = True
    """Before the first step, run forward and backward of each rank's largest micro-batch of
    the steps to train (train/run/warmup.py; no update): memory grows to that size there (the
    host heap's first touch on CPU, the caching allocator on GPU), so an out-of-memory error
    comes before step 1 and perf/step_s times steady steps."""

    backend: ClassVar[str] = "gloo"
    device: ClassVar[str] = "cpu"
    params_dtype: ClassVar[str] = "float32"
    use_distributed_optimizer: ClassVar[bool] = False

    def num_steps(self, job: Job) -> int:
        """Steps this run trains: the schedule's, or the first max_steps of them."""
        total = len(job.schedule.steps)
        return total if self.max_steps is None else min(self.max_steps, total)


@dataclass
class GpuTrainer(CpuTrainer):
    """Train with megatron-core on NCCL GPUs: the same engine, bf16, TE layers where installed."""

    achieved_tflops: float = 400.0
    lr: float = 1e-6
    """AdamW learning rate (constant); lower than the CPU trainer's, for real model sizes."""
    params_dtype: str = "bfloat16"
    """Model weights' dtype: bfloat16, float16 or float32."""
    use_distributed_optimizer: bool = False
    """megatron's distributed optimizer: optimizer state sharded over the DP ranks."""

    backend: ClassVar[str] = "nccl"
    device: ClassVar[str] = "cuda"


Trainer = PlanTrainer | CpuTrainer
"""What the `trainer` group builds (GpuTrainer is a CpuTrainer)."""
