"""slime's `get_seqlen_balanced_partitions` (verl's Karmarkar-Karp), tie-breaking and checks kept.

Written from its documented behaviour so that legacy presets reproduce slime's micro-batches
exactly; the fast `karmarkar_karp` beside it is what slime_hydra's own strategies use.

- A part ("set") compares by (sum, item count, its (index, weight) list in insertion order);
  every state keeps its k sets in descending order of that key.
- The state with the largest spread (heaviest minus lightest set) is merged first; equal
  spreads: the state whose heaviest set is larger goes first. Indices are distinct across
  states, so this is a total order and any priority queue pops the same sequence.
- Merging joins set i of the first state with set k-1-i of the second, items appended.
- Checks, with slime's messages: n >= k; with equal_size, k divides n; the k partitions are
  non-empty and cover every item. Each returned partition is sorted by index.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from slime_hydra.partition.base import Parts


class SlimeAssertionError(Exception):
    """slime raises AssertionError here; the message is slime's own."""


class _Set:
    __slots__ = ("items", "total")

    def __init__(self) -> None:
        self.total = 0
        self.items: list[tuple[int, int]] = []

    def key(self) -> tuple[int, int, list[tuple[int, int]]]:
        return self.total, len(self.items), self.items


class _State:
    __slots__ = ("sets",)

    def __init__(self, items: Sequence[tuple[int, int]], k: int) -> None:
        self.sets = [_Set() for _ in range(k)]
        for s, (idx, weight) in zip(self.sets, items, strict=False):
            s.items.append((idx, weight))
            s.total += weight
        self.sets.sort(key=_Set.key, reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].total - self.sets[-1].total

    def __lt__(self, other: _State) -> bool:
        # Popped first: the larger spread, then the larger heaviest set.
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0].key() > other.sets[0].key()

    def merge(self, other: _State) -> None:
        k = len(self.sets)
        for i, s in enumerate(self.sets):
            o = other.sets[k - 1 - i]
            s.items.extend(o.items)
            s.total += o.total
        self.sets.sort(key=_Set.key, reverse=True)


def slime_balanced_partitions(weights: Sequence[int], k: int, equal_size: bool) -> Parts:
    """k partitions of item indices as slime's get_seqlen_balanced_partitions returns them.

    Raises SlimeAssertionError with slime's message where slime's assertions fail.
    """
    n = len(weights)
    if n < k:
        raise SlimeAssertionError(f"number of items:[{n}] < k_partitions:[{k}]")
    ascending = sorted((w, i) for i, w in enumerate(weights))
    if equal_size:
        if n % k:
            raise SlimeAssertionError(f"{n} % {k} != 0")
        states = [
            _State([(i, w) for w, i in ascending[start : start + k]], k) for start in range(0, n, k)
        ]
    else:
        states = [_State([(i, w)], k) for w, i in ascending]
    heapq.heapify(states)
    while len(states) > 1:
        first = heapq.heappop(states)
        first.merge(heapq.heappop(states))
        heapq.heappush(states, first)
    parts = [[i for i, _ in s.items] for s in states[0].sets] if states else []
    for p, part in enumerate(parts):
        if equal_size and len(part) * k != n:
            raise SlimeAssertionError(f"{len(part)} * {k} != {n}")
        if not part:
            raise SlimeAssertionError(f"the {p}-th partition is empty")
    return [sorted(part) for part in parts]


def slime_capped_partitions(weights: Sequence[int], k: int, cap: int) -> Parts:
    """slime PR #1823's `_get_capped_partitions`: first-fit in index order into exactly k bins
    under `cap` (bins may stay empty); raises where an item fits no bin."""
    parts: Parts = [[] for _ in range(k)]
    sums = [0] * k
    for i, w in enumerate(weights):
        for b in range(k):
            if sums[b] + w <= cap:
                parts[b].append(i)
                sums[b] += w
                break
        else:
            raise SlimeAssertionError("This should never happen.")
    return parts


def slime_first_fit_count(weights: Sequence[int], cap: int) -> int:
    """slime's get_minimum_num_micro_batch_size: first-fit bins in order (an item over the cap
    opens a bin that nothing else joins)."""
    loads: list[int] = []
    for w in weights:
        for b, load in enumerate(loads):
            if load + w <= cap:
                loads[b] += w
                break
        else:
            loads.append(w)
    return len(loads)
