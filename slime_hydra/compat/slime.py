"""slime's calls, cap-safe: swap `from slime.utils.seqlen_balancing import ...` and
`from slime.utils.data import get_minimum_num_micro_batch_size` for this module.

slime (before #1926) counted each DP rank's micro-batches by first fit, took the MAX over DP,
rounded it to the VPP group (down in #1848, so below what the cap needs) and cut each rank's
samples into that many parts by Karmarkar-Karp, which ignores the cap (#1823's fallback left
trailing parts empty, #1838/#1860). `plan_micro_batches` plans the whole step for all ranks at
once instead: one count, rounded up, every part within the cap and non-empty.
"""

from __future__ import annotations

from collections.abc import Sequence

from slime_hydra.compat.partitions import get_seqlen_balanced_partitions
from slime_hydra.compat.step import plan_step
from slime_hydra.errors import SlimeHydraError

__all__ = [
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
    samples never exceeds it, a sample over it sits alone (as slime's first fit puts it). So the
    count can be above ⌈Σ/cap / dp_size⌉ and above what each rank's first fit would ask for
    alone; it is the same on every rank, a multiple of microbatch_group_size_per_vp_stage when
    vpp_size > 1 (rounded up, never down as slime #1848 did), and no part is empty. The DP split
    is planned here too: each rank gets the samples of its partitions, balanced by tokens.
    """
    if vpp_size > 1 and microbatch_group_size_per_vp_stage is None:
        raise SlimeHydraError(
            f"plan_micro_batches: vpp_size={vpp_size} needs microbatch_group_size_per_vp_stage "
            "(megatron's model config holds it; its default is the pipeline size); pass it."
        )
    alignment = microbatch_group_size_per_vp_stage if vpp_size > 1 else 1
    assert alignment is not None
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
