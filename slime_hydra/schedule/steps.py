"""Cutting a rollout into optimizer steps without splitting a rollout group across steps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slime_hydra.errors import SlimeHydraError


def split_steps(
    group_ids: Sequence[int],
    global_batch_size: int | None,
    step_ids: Sequence[int] | None = None,
) -> list[list[int]]:
    """Global sample indices of each step (ascending within a step).

    With `step_ids` (from a trace) the steps are given; otherwise whole groups, in order of
    first appearance, fill steps of `global_batch_size` samples. Either way no group
    straddles two steps. O(n log n) with numpy.
    """
    n = len(group_ids)
    if step_ids is None and global_batch_size in (None, n):  # one step holds every group
        return [list(range(n))]
    groups = np.asarray(group_ids, dtype=np.int64)
    if step_ids is not None:
        steps = np.asarray(step_ids, dtype=np.int64)
        _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
        split = np.flatnonzero(steps != steps[first][inverse])
        if split.size:
            i = int(split[0])
            g = int(groups[i])
            raise SlimeHydraError(
                f"rollout group {g} has samples in steps {int(steps[first[inverse[i]]])} and "
                f"{int(steps[i])} (sample {i}); samples of one group must share a step."
            )
        order = np.argsort(steps, kind="stable")
        cuts = np.flatnonzero(np.diff(steps[order])) + 1
        return [part.tolist() for part in np.split(order, cuts)]
    gbs = n if global_batch_size is None else global_batch_size
    if n % gbs:
        raise SlimeHydraError(
            f"the rollout has {n} samples, not a multiple of batching.global_batch_size={gbs}; "
            "set batching.global_batch_size to a divisor of the rollout size so no sample is "
            "dropped."
        )
    _, first, inverse, sizes = np.unique(
        groups, return_index=True, return_inverse=True, return_counts=True
    )
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)  # by first appearance
    order = np.argsort(rank[inverse], kind="stable")
    in_order = np.argsort(first, kind="stable")
    ends = np.cumsum(sizes[in_order])
    starts = ends - sizes[in_order]
    straddle = np.flatnonzero(starts // gbs != (ends - 1) // gbs)
    if straddle.size:
        g = in_order[int(straddle[0])]
        raise SlimeHydraError(
            f"rollout group {int(groups[first[g]])} has {int(sizes[g])} samples and would "
            f"straddle two steps of batching.global_batch_size={gbs}; set "
            "batching.global_batch_size to a multiple of the group size."
        )
    return [part.tolist() for part in np.split(order, range(gbs, n, gbs))]
