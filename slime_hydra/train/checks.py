"""Checks a training run must pass before any worker starts; plain Python, no torch."""

from __future__ import annotations

from slime_hydra.errors import SlimeHydraError
from slime_hydra.schedule import BatchingStrategy, ParallelLayout, Schedule


def check_world_size(layout: ParallelLayout, world_size: int, source: str) -> None:
    """The process count must equal dp × tp × pp × cp."""
    if world_size != layout.world_size:
        raise SlimeHydraError(
            f"{source} gives {world_size} processes, but parallel.dp×tp×pp×cp = "
            f"{layout.dp}×{layout.tp}×{layout.pp}×{layout.cp} = {layout.world_size}: set "
            f"trainer.nproc_per_node={layout.world_size} (or torchrun's --nproc-per-node × "
            "--nnodes), or change parallel.dp/tp/pp/cp to match."
        )


def check_gloo_layout(layout: ParallelLayout) -> None:
    """The CPU trainer runs tensor and data parallelism only."""
    sizes = {"pp": layout.pp, "vpp": layout.vpp, "cp": layout.cp}
    bad = [f"parallel.{name}={size}" for name, size in sizes.items() if size > 1]
    if layout.sequence_parallel:
        bad.append("parallel.sequence_parallel=true")
    if bad:
        raise SlimeHydraError(
            f"{', '.join(bad)} needs trainer=gpu: trainer=cpu (gloo) runs only tensor and data "
            "parallelism, because megatron-core's pipeline schedules, context-parallel "
            "attention and sequence parallelism need CUDA. Turn them off, or use trainer=plan "
            "to simulate this layout."
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
                f"step {st.step}: {m} micro-batches per rank with parallel.pp={pp} and "
                f"parallel.microbatch_group_size_per_vp_stage={group}; megatron-core's "
                "interleaved schedule needs pp ≤ group ≤ micro-batches and micro-batches % group "
                "equal to 0 or ≥ pp. Lower parallel.microbatch_group_size_per_vp_stage, lower "
                "batching.max_tokens_per_gpu (more micro-batches), or raise "
                "batching.global_batch_size."
            )


def check_trainable(schedule: Schedule, strategy: BatchingStrategy) -> None:
    """Refuse a schedule with an empty micro-batch: a rank would have nothing to run."""
    for st in schedule.steps:
        for r, rank in enumerate(st.ranks):
            for m, mb in enumerate(rank):
                if not mb:
                    raise SlimeHydraError(
                        f"batching={strategy.name} left micro-batch {m} of DP rank {r} empty "
                        f"at step {st.step} (slime issue #1838), which training cannot run; "
                        "trainer=plan measures this preset, or use batching=dynamic to train."
                    )


def check_steps(
    num_steps: int, save_interval: int | None, max_steps: int | None, fail_at_step: int | None
) -> None:
    """Step counts in the trainer config must be positive and inside the run."""
    for name, value in (("save_interval", save_interval), ("max_steps", max_steps)):
        if value is not None and value < 1:
            raise SlimeHydraError(f"trainer.{name}={value} must be a positive number of steps.")
    if fail_at_step is not None and not 0 <= fail_at_step < num_steps:
        raise SlimeHydraError(
            f"trainer.fail_at_step={fail_at_step} is outside the run's steps [0, {num_steps})."
        )
