"""Karmarkar-Karp largest differencing into k parts, free-size or equal-size.

A state is k partial parts sorted by weight; the two states with the largest spread are merged
by pairing the heaviest part of one with the lightest of the other.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from slime_hydra.partition.base import PartitionError, Parts
from slime_hydra.partition.deal import descending


def karmarkar_karp(weights: Sequence[int], k: int, equal_size: bool = False) -> Parts:
    """Largest-differencing k-way partition of item indices by weight.

    With `equal_size`, part sizes differ by at most one item (zero-weight fillers pad n to a
    multiple of k and are dropped). Free-size parts may come back empty when n < k.
    """
    if k < 1:
        raise PartitionError(f"karmarkar_karp needs k >= 1 parts, got {k}")
    n = len(weights)
    order = descending(np.asarray(weights, dtype=np.int64)).tolist()
    # Each state: (-spread, tie, sums descending, member lists aligned with sums).
    states: list[tuple[int, int, list[int], list[list[int]]]] = []
    if equal_size:
        padded: list[int | None] = [*order, *([None] * ((-n) % k))]
        for start in range(0, len(padded), k):
            chunk = padded[start : start + k]
            sums = [0 if i is None else weights[i] for i in chunk]
            members = [[] if i is None else [i] for i in chunk]
            states.append((-(sums[0] - sums[-1]), start, sums, members))
    else:
        for rank, i in enumerate(order):
            sums = [weights[i]] + [0] * (k - 1)
            states.append((-weights[i], rank, sums, [[i]] + [[] for _ in range(k - 1)]))
    heapq.heapify(states)
    tie = len(states)
    while len(states) > 1:
        _, _, sums_a, members_a = heapq.heappop(states)
        _, _, sums_b, members_b = heapq.heappop(states)
        paired = [sa + sb for sa, sb in zip(sums_a, reversed(sums_b), strict=True)]
        rank = sorted(range(k), key=paired.__getitem__, reverse=True)
        sums = [paired[j] for j in rank]
        members = [members_a[j] + members_b[k - 1 - j] for j in rank]
        heapq.heappush(states, (-(sums[0] - sums[-1]), tie, sums, members))
        tie += 1
    return [sorted(part) for part in states[0][3]] if states else [[] for _ in range(k)]
