"""verl's calls, cap-safe: swap `from verl.utils.seqlen_balancing import
get_seqlen_balanced_partitions` for this module, and plan micro-batch indices with
`plan_micro_batches` where verl's `rearrange_micro_batches` computes them.

verl counts min(n, ⌈Σ/max_token_len⌉) micro-batches, the MAX over DP, rounded up to
num_batches_divided_by, then cuts the batch into that many parts by Karmarkar-Karp on a FLOPs
workload, which ignores max_token_len: a part can hold more tokens than the cap and run out of
memory (#6735; #7553 then raised the count until the parts fit). Here the cap is hard from the
start and the count is what it takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from slime_hydra.compat.partitions import get_seqlen_balanced_partitions
from slime_hydra.compat.step import plan_step
from slime_hydra.errors import SlimeHydraError

__all__ = ["get_num_micro_batches", "get_seqlen_balanced_partitions", "plan_micro_batches"]


def get_num_micro_batches(
    seqlen_list: Sequence[int], max_token_len: int, num_batches_divided_by: int | None = None
) -> int:
    """Micro-batches one rank's `seqlen_list` needs with none over `max_token_len`, a multiple of
    `num_batches_divided_by` if given: what replaces verl's
    roundup_divisible(min(n, ceildiv(Σ, max_token_len)), num_batches_divided_by). It is at least
    that and can be more, because samples do not split: lengths [7] × 8 under 8 need 8, where
    ⌈56/8⌉ = 7 puts two sevens in one part of 14 tokens."""
    if not seqlen_list:
        return 0
    return len(plan_micro_batches(seqlen_list, max_token_len, None, num_batches_divided_by))


@overload
def plan_micro_batches(
    seqlen_list: Sequence[int],
    max_token_len: int,
    dp_size: None = None,
    num_batches_divided_by: int | None = None,
) -> list[list[int]]: ...


@overload
def plan_micro_batches(
    seqlen_list: Sequence[int],
    max_token_len: int,
    dp_size: int,
    num_batches_divided_by: int | None = None,
) -> list[list[list[int]]]: ...


def plan_micro_batches(
    seqlen_list: Sequence[int],
    max_token_len: int,
    dp_size: int | None = None,
    num_batches_divided_by: int | None = None,
) -> list[list[int]] | list[list[list[int]]]:
    """Micro-batches as index lists into `seqlen_list` (each sorted), like the index lists
    `rearrange_micro_batches` returns: none empty, none of more than `max_token_len` tokens,
    their count a multiple of `num_batches_divided_by` (megatron's VPP group) if given.

    Without `dp_size` the lengths are one rank's and the result is its micro-batches. verl syncs
    the count over the DP group with an all-reduce; a pure function cannot, so with `dp_size`
    the lengths are the whole DP group's batch and the result is `[rank][microbatch]`: the same
    count on every rank and the samples split across ranks to fit it, so no rank gets a count
    it has too few samples for (verl asserts there). A sample over `max_token_len` is an error,
    as verl's assert is. `max_token_len` is the whole cap of one micro-batch: multiply in the
    context- or sequence-parallel size first if your config counts per GPU.
    """
    if num_batches_divided_by is not None and num_batches_divided_by < 1:
        raise SlimeHydraError(
            f"plan_micro_batches: num_batches_divided_by={num_batches_divided_by} must be a "
            "positive integer or None."
        )
    if dp_size is not None and dp_size < 1:
        raise SlimeHydraError(
            f"plan_micro_batches: dp_size={dp_size} must be a positive integer or None."
        )
    ranks = plan_step(
        [int(n) for n in seqlen_list],
        max_token_len,
        dp=dp_size or 1,
        alignment=num_batches_divided_by or 1,
        isolate=False,
        caller="plan_micro_batches",
    )
    return ranks[0] if dp_size is None else ranks
