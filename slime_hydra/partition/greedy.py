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
