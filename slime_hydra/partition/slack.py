"""Minimum bin slack packing, to repair a near-full packing that needs a few bins too many.

Gupta and Ho's minimum bin slack (MBS) fills one bin at a time: it opens with the largest item
left and fills the room beside it with the subset of the other items left whose sum is largest
(a subset-sum over a bitset: one big-integer shift per candidate). Where first-fit decreasing
stops once the room is below every item left, MBS fills it exactly when any subset can, which
is what a step whose tokens nearly fill every micro-batch needs. It is O(items² × cap / 64)
machine words, so `repack_overflow` runs it only on the items that first-fit decreasing could
not place together with those of its most wasteful bins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slime_hydra.partition.bounds import min_bins_lower_bound

REPACK_ITEMS = 1024  # items repacked by MBS at most (tens of ms of pure Python)


def min_slack_fill(sizes: Sequence[int], cap: int, max_bins: int) -> list[list[int]] | None:
    """MBS bins of item indices (every size <= cap), or None if it needs more than
    `max_bins`. Among equally full fills it takes the larger items (ties by index)."""
    left = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    bins: list[list[int]] = []
    while left:
        if len(bins) == max_bins:
            return None
        first, rest = left[0], left[1:]
        room = cap - sizes[first]
        cand = [i for i in rest if sizes[i] <= room]
        mask = (1 << (room + 1)) - 1
        reach = 1  # bit t set: some subset of the candidates so far sums to t
        before: list[int] = []
        for i in cand:
            before.append(reach)
            reach |= (reach << sizes[i]) & mask
            if reach >> room:
                break
        t = reach.bit_length() - 1
        take = set()
        for j in range(len(before) - 1, -1, -1):
            if not (before[j] >> t) & 1:  # t needs candidate j: without it, t is unreachable
                take.add(cand[j])
                t -= sizes[cand[j]]
        bins.append([first, *sorted(take)])
        left = [i for i in rest if i not in take]
    return bins


def repack_overflow(
    sizes: np.ndarray, cap: int, bin_of: np.ndarray, bins: int
) -> np.ndarray | None:
    """`bin_of` (a packing into bins of `cap`, maybe past `bins`) within `bins` bins, or None.

    The items of bins `bins` and beyond, together with those of the P most wasteful bins
    below (most room left first, ties by bin), are repacked by MBS into those P bins; P starts
    at four times the bins too many and doubles (up to `bins`) while the repacked items stay
    within REPACK_ITEMS. None at once where Martello-Toth's L2 proves `bins` too few. Bins
    the repacking leaves unused stay empty."""
    extra = int(bin_of.max()) + 1 - bins
    if extra <= 0:
        return bin_of
    if min_bins_lower_bound(sizes, cap) > bins:
        return None
    waste = cap - np.bincount(bin_of, weights=sizes, minlength=bins)[:bins]
    by_waste = np.lexsort((np.arange(bins), -waste))
    overflow = bin_of >= bins
    pool_bins = min(4 * extra, bins)
    while True:
        chosen = by_waste[:pool_bins]
        pool = np.flatnonzero(overflow | np.isin(bin_of, chosen))
        if pool.size > REPACK_ITEMS:
            return None
        packed = min_slack_fill(sizes[pool].tolist(), cap, pool_bins)
        if packed is not None:
            out = bin_of.copy()
            for b, members in zip(chosen.tolist(), packed, strict=False):
                out[pool[members]] = b
            return out
        if pool_bins == bins:
            return None
        pool_bins = min(2 * pool_bins, bins)
