"""Greedy partitioners: longest-processing-time-first balancing and first-fit bin packing."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Sequence

import numpy as np

from slime_hydra.partition.base import Parts


def descending(weights: Sequence[int]) -> list[int]:
    """Indices by weight, heaviest first, ties by index (deterministic)."""
    return np.argsort(-np.asarray(weights, dtype=np.int64), kind="stable").tolist()


def lpt(weights: Sequence[int], k: int, order: Sequence[int] | None = None) -> Parts:
    """Each item, heaviest first, into the currently lightest of k parts (Graham's LPT)."""
    parts: Parts = [[] for _ in range(k)]
    heap = [(0, p) for p in range(k)]
    for i in descending(weights) if order is None else order:
        total, p = heap[0]
        parts[p].append(i)
        heapq.heapreplace(heap, (total + weights[i], p))
    return parts


def first_fit(
    weights: Sequence[int],
    cap: int,
    order: Iterable[int] | None = None,
    max_bins: int | None = None,
) -> Parts | None:
    """Each item, in `order`, into the first bin with room under `cap`.

    Bins open as needed; with `max_bins` set, returns None when an item fits in none of them.
    An item heavier than `cap` gets a bin of its own.
    """
    n_max = len(weights) if max_bins is None else max_bins
    room = np.full(max(n_max, 1), np.iinfo(np.int64).max, dtype=np.int64)
    parts: Parts = []
    for i in range(len(weights)) if order is None else order:
        w = weights[i]
        b = int((room >= w).argmax()) if parts else 0
        if b < len(parts) and room[b] >= w:
            room[b] -= w
            parts[b].append(i)
            continue
        if len(parts) >= n_max:
            return None
        b = len(parts)
        room[b] = cap - w
        parts.append([i])
    return parts


def best_fit(weights: Sequence[int], cap: int, k: int, order: Iterable[int]) -> Parts | None:
    """Each item, in `order`, into the fullest of k bins that still has room under `cap`.

    Returns None when an item fits in no bin. Heaviest-first order makes this best-fit
    decreasing, which packs as tightly as first-fit decreasing in O(log k) per item.
    """
    parts: Parts = [[] for _ in range(k)]
    keys = [cap * k + b for b in range(k)]  # room × k + bin: sorted by room, then bin
    for i in order:
        w = weights[i]
        at = bisect.bisect_left(keys, w * k)
        if at == len(keys):
            return None
        key = keys.pop(at)
        parts[key % k].append(i)
        bisect.insort(keys, key - w * k)
    return parts


def first_fit_decreasing(sizes: np.ndarray, cap: int) -> np.ndarray:
    """The bin (0, 1, ...) of each item under first-fit decreasing into bins of `cap`; items
    must be at most `cap`.

    FFD is built bin by bin: a bin opens with the largest item left and takes, while any fits,
    the largest item left that fits (the same packing as placing items heaviest first into the
    first bin with room). The items sit in ascending order; a table gives the last position of
    each size up to `cap`, and "largest left at or below a position" is a union-find over taken
    positions, so each item costs near-constant time after the sort: O(n log n + cap), with no
    list deletions. Ties go to the higher index.
    """
    n = len(sizes)
    order = np.argsort(sizes, kind="stable")
    asc = sizes[order]
    # upto[v]: the highest position of an item of size <= v (position 0: "nothing left").
    upto = np.searchsorted(asc, np.arange(cap + 1), side="right").tolist()
    asc = [0, *asc.tolist()]
    below = list(range(n + 1))  # below[p] == p: position p is free; else a lower position
    placed = [0] * (n + 1)

    def free_at_or_below(p: int) -> int:
        root = p
        while below[root] != root:
            root = below[root]
        while below[p] != root:
            below[p], p = root, below[p]
        return root

    bins = 0
    top = n
    while True:
        top = free_at_or_below(top)
        if top == 0:
            break
        below[top] = top - 1
        placed[top] = bins
        room = cap - asc[top]
        while True:
            p = upto[room]
            if below[p] != p:
                p = free_at_or_below(p)
            if p == 0:
                break
            below[p] = p - 1
            placed[p] = bins
            room -= asc[p]
        bins += 1
    out = np.empty(n, dtype=np.int64)
    out[order] = placed[1:]
    return out
