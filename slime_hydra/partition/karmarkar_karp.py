"""Karmarkar-Karp largest differencing into k parts, free-size or equal-size.

A state is k partial parts sorted by weight; the two states with the largest spread are merged
by pairing the heaviest part of one with the lightest of the other. Part members are kept as
nested pairs and flattened once at the end, so a merge costs O(k log k), not O(n).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from slime_hydra.partition.base import PartitionError, Parts
from slime_hydra.partition.greedy import descending

# A member tree is an item index, a pair of trees, or None for no item.
_Tree = int | tuple | None


def _flatten(tree: _Tree, out: list[int]) -> None:
    stack = [tree]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        if isinstance(node, tuple):
            stack.extend(node)
        else:
            out.append(node)


def karmarkar_karp(weights: Sequence[int], k: int, equal_size: bool = False) -> Parts:
    """Largest-differencing k-way partition of item indices by weight.

    With `equal_size`, part sizes differ by at most one item (zero-weight fillers pad n to a
    multiple of k and are dropped). Free-size parts may come back empty when n < k.
    """
    if k < 1:
        raise PartitionError(f"karmarkar_karp needs k >= 1 parts, got {k}")
    n = len(weights)
    order = descending(weights)
    # Each state: (-spread, tie, sums descending, trees aligned with sums).
    states: list[tuple[int, int, list[int], list[_Tree]]] = []
    if equal_size:
        fillers = (-n) % k
        padded = order + [None] * fillers
        for start in range(0, len(padded), k):
            chunk = padded[start : start + k]
            sums = [0 if i is None else weights[i] for i in chunk]
            states.append((-(sums[0] - sums[-1]), start, sums, list(chunk)))
    else:
        for rank, i in enumerate(order):
            sums = [weights[i]] + [0] * (k - 1)
            states.append((-weights[i], rank, sums, [i] + [None] * (k - 1)))
    heapq.heapify(states)
    tie = len(states)
    while len(states) > 1:
        _, _, sums_a, trees_a = heapq.heappop(states)
        _, _, sums_b, trees_b = heapq.heappop(states)
        merged = sorted(
            zip(
                (sa + sb for sa, sb in zip(sums_a, reversed(sums_b), strict=True)),
                range(k),
                strict=True,
            ),
            reverse=True,
        )
        sums = [s for s, _ in merged]
        trees = [(trees_a[j], trees_b[k - 1 - j]) for _, j in merged]
        heapq.heappush(states, (-(sums[0] - sums[-1]), tie, sums, trees))
        tie += 1
    parts: Parts = []
    for tree in states[0][3] if states else [None] * k:
        members: list[int] = []
        _flatten(tree, members)
        members.sort()
        parts.append(members)
    return parts
