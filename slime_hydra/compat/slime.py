"""slime's calls, cap-safe: swap `from slime.utils.dp_schedule import build_dp_schedule` (slime
since #1926), or `from slime.utils.seqlen_balancing import ...` and
`from slime.utils.data import get_minimum_num_micro_batch_size` (before it), for this module.

slime (before #1926) counted each DP rank's micro-batches by first fit, took the MAX over DP,
rounded it to the VPP group (down in #1848, so below what the cap needs) and cut each rank's
samples into that many parts by Karmarkar-Karp, which ignores the cap (#1823's fallback left
trailing parts empty, #1838/#1860). `plan_micro_batches` plans the whole step for all ranks at
once instead: one count, rounded up, every part within the cap and non-empty. #1926's
`build_dp_schedule` packs each step by first fit and splits bins up to a multiple of dp × the
VPP group, which asserts where splitting runs out, and its FLOPs path ignores the cap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slime_hydra.compat.partitions import get_seqlen_balanced_partitions
from slime_hydra.compat.step import plan_step
from slime_hydra.errors import SlimeHydraError

__all__ = [
    "build_dp_schedule",
    "get_minimum_num_micro_batch_size",
    "get_seqlen_balanced_partitions",
    "plan_micro_batches",
]


def get_minimum_num_micro_batch_size(total_lengths: Sequence[int], max_tokens_per_gpu: int) -> int:
    """Micro-batches one rank needs for `total_lengths` under the cap `max_tokens_per_gpu` (slime
    passes max_tokens_per_gpu × cp here): the count slime_hydra's planner reaches, a sample over
    the cap alone. At least ⌈Σ/cap⌉ and never more than slime's in-order first fit, often fewer.
    Only a count: cutting a rank into it with get_seqlen_balanced_partitions can still break the
    cap, as slime's did; `plan_micro_batches` gives parts that hold it."""
    if not total_lengths:
        return 0
    ranks = plan_step(
        [int(n) for n in total_lengths],
        max_tokens_per_gpu,
        dp=1,
        alignment=1,
        isolate=True,
        caller="get_minimum_num_micro_batch_size",
    )
    return len(ranks[0])


def plan_micro_batches(
    step_lengths: Sequence[int],
    max_tokens_per_gpu: int,
    cp_size: int = 1,
    dp_size: int = 1,
    vpp_size: int = 1,
    microbatch_group_size_per_vp_stage: int | None = None,
) -> tuple[int, list[list[list[int]]]]:
    """One training step of slime: the micro-batch count every DP rank runs and
    `partitions[rank][microbatch]`, indices into `step_lengths` (the whole step, all ranks).

    The cap is max_tokens_per_gpu × cp_size per micro-batch and is hard: a part of two or more
    samples never exceeds it, a sample over it sits alone (as slime's first fit puts it), so the
    count can be above ⌈Σ / cap / dp_size⌉. It is the same on every rank, a multiple of
    microbatch_group_size_per_vp_stage when vpp_size > 1 (rounded up, never down as slime #1848
    did), and no part is empty. The DP split is planned here too: each rank gets the samples of
    its partitions, balanced by tokens.
    """
    alignment = 1
    if vpp_size > 1:
        if microbatch_group_size_per_vp_stage is None:
            raise SlimeHydraError(
                f"plan_micro_batches: vpp_size={vpp_size} needs microbatch_group_size_per_vp_stage "
                "(megatron's model config holds it; its default is the pipeline size); pass it."
            )
        alignment = microbatch_group_size_per_vp_stage
    if cp_size < 1 or dp_size < 1 or alignment < 1:
        raise SlimeHydraError(
            f"plan_micro_batches: cp_size={cp_size}, dp_size={dp_size} and "
            f"microbatch_group_size_per_vp_stage={alignment} must be positive integers."
        )
    partitions = plan_step(
        [int(n) for n in step_lengths],
        max_tokens_per_gpu * cp_size,
        dp=dp_size,
        alignment=alignment,
        isolate=True,
        caller="plan_micro_batches",
    )
    return len(partitions[0]), partitions


def build_dp_schedule(
    args: Any,
    train_parallel_config: Mapping[str, int],
    total_lengths: Sequence[int],
    *,
    global_batch_size: int,
    rollout_indices: Sequence[int],
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    """slime's `(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)` for a
    rollout, each step planned by `plan_micro_batches`: `partitions[r]` the global sample
    indices of rank r, step after step; `micro_batch_indices[r]` its micro-batches as positions
    in `partitions[r]` (together they tile it); `num_microbatches[s]` the count of step s on
    every rank; `global_batch_sizes[s]` = `global_batch_size`.

    As slime: steps of `global_batch_size` rollouts (samples sharing a rollout index stay in one
    step), trailing rollouts that fill no step dropped; the cap is args.max_tokens_per_gpu ×
    cp_size and a sample over it sits alone. Unlike slime: the count is the planner's (a
    multiple of the VPP group, never an assert), ranks are balanced by tokens whatever
    args.balance_data and args.balance_by_flops say, and only dynamic batching
    (args.use_dynamic_batch_size) is planned here.
    """
    if not getattr(args, "use_dynamic_batch_size", False) or args.max_tokens_per_gpu is None:
        raise SlimeHydraError(
            "build_dp_schedule: this drop-in plans dynamic batching only; set "
            "--use-dynamic-batch-size and --max-tokens-per-gpu, or keep slime's own "
            "build_dp_schedule for fixed --micro-batch-size batching."
        )
    members: dict[int, list[int]] = {}
    for position, rollout in enumerate(rollout_indices):
        members.setdefault(int(rollout), []).append(position)
    rollouts = list(members)
    num_steps = len(rollouts) // global_batch_size
    if num_steps < 1:
        raise SlimeHydraError(
            f"build_dp_schedule: {len(rollouts)} rollouts fill no step of global_batch_size="
            f"{global_batch_size} rollouts; lower --global-batch-size to {len(rollouts)} or less."
        )
    dp = train_parallel_config["dp_size"]
    partitions: list[list[int]] = [[] for _ in range(dp)]
    micro_batch_indices: list[list[list[int]]] = [[] for _ in range(dp)]
    num_microbatches: list[int] = []
    for s in range(num_steps):
        chosen = rollouts[s * global_batch_size : (s + 1) * global_batch_size]
        samples = [position for rollout in chosen for position in members[rollout]]
        count, ranks = plan_micro_batches(
            [total_lengths[i] for i in samples],
            args.max_tokens_per_gpu,
            cp_size=train_parallel_config["cp_size"],
            dp_size=dp,
            vpp_size=train_parallel_config["vpp_size"],
            microbatch_group_size_per_vp_stage=train_parallel_config[
                "microbatch_group_size_per_vp_stage"
            ],
        )
        num_microbatches.append(count)
        for partition, indices, rank in zip(partitions, micro_batch_indices, ranks, strict=True):
            for mb in rank:
                start = len(partition)
                partition.extend(samples[j] for j in mb)
                indices.append(list(range(start, start + len(mb))))
    return partitions, micro_batch_indices, num_microbatches, [global_batch_size] * num_steps
