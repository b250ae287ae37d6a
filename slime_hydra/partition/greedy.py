"""Greedy bin packing: first-fit in a given order, and first-fit decreasing in near-linear time."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from slime_hydra.partition.base import Parts
from slime_hydra.partition.deal import ascending


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


def first_fit_decreasing(sizes: np.ndarray, cap: int) -> np.ndarray:
    """The bin (0, 1, ...) of each item under first-fit decreasing into bins of `cap`; items
    must be at most `cap`.

    FFD is built bin by bin: a bin opens with the largest item left and takes, while any fits,
    the largest item left that fits (the same packing as placing items heaviest first into the
    first bin with room). The items sit in ascending order; a table gives the last position of
    each size up to `cap`, and "largest left at or below a position" is a union-find over taken
    positions (path halving, inline: a call per lookup cost 15% at 1M items), so each item costs
    near-constant time after the sort: O(n log n + cap), with no list deletions. Ties go to the
    higher index.
    """
    n = len(sizes)
    order = ascending(sizes)
    asc = sizes[order]
    # upto[v]: the highest position of an item of size <= v (position 0: "nothing left").
    upto = np.searchsorted(asc, np.arange(cap + 1), side="right").tolist()
    asc = [0, *asc.tolist()]
    below = list(range(n + 1))  # below[p] == p: position p is free; else a lower position
    placed = [0] * (n + 1)
    bins = 0
    top = n
    while True:
        while below[top] != top:  # the highest free position at or below, halving the path
            below[top] = below[below[top]]
            top = below[top]
        if top == 0:
            break
        below[top] = top - 1
        placed[top] = bins
        room = cap - asc[top]
        while True:
            p = upto[room]
            while below[p] != p:
                below[p] = below[below[p]]
                p = below[p]
            if p == 0:
                break
            below[p] = p - 1
            placed[p] = bins
            room -= asc[p]
        bins += 1
    out = np.empty(n, dtype=np.int64)
    out[order] = placed[1:]
    return out
