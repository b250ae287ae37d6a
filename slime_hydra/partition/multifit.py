"""MULTIFIT (Coffman, Garey and Johnson, 1978): a balanced packing into a given number of bins
found as a bin packing, first-fit decreasing under a load limit bisected toward its bound.

Where bins hold one large item and a few small ones (samples just over half the cap beside
short ones, GRPO steps of two or three samples a micro-batch), exchanges of one item at a time
can stall above the bound while FFD under a limit just above it packs the whole step: on three
such steps of 3,034 samples in 1,340 micro-batches the exchanges stopped 2.5-3.5% above the
bound, and FFD under a bisected limit (eight packings) 0.03-0.04% above it. FFD is pure Python,
so its cost is charged to the work budget like the exchanges' (VISITS_PER_ITEM).
"""

from __future__ import annotations

import numpy as np

from slime_hydra.partition.base import Work
from slime_hydra.partition.deal import descending
from slime_hydra.partition.greedy import first_fit_decreasing

VISITS_PER_ITEM = 10
"""What one item of first-fit decreasing costs in `Work` item visits: its pure-Python loop took
650-1,100 ns an item where an exchange pass took ~100 ns a visit, on the same loaded machine
(2026-12-01, steps of 3-16k samples)."""


def multifit(
    sizes: np.ndarray, bins: int, low: int, high: int, goal: int, rel_tol: float, work: Work
) -> np.ndarray | None:
    """The bin (0..bins-1) of each item under the lowest load limit in [`low`, `high`) at which
    first-fit decreasing packs `sizes` into at most `bins` bins, tried first at `goal` (where
    balancing would stop) and then bisected until the bracket is within `rel_tol` of `low`;
    None where no limit tried packs. `low` is a proven bound (at least the largest item), so
    every limit tried admits every item. Each packing costs VISITS_PER_ITEM visits of `work`
    an item, and none is started that `work` cannot pay for. Bins FFD leaves empty get one
    item each from bins of two or more (len(sizes) >= bins), so the heaviest bin is at most
    the limit."""
    n = len(sizes)
    best = None
    lo, hi = low, high  # hi: the lowest limit known to pack (the plan's own heaviest bin)
    limit = min(max(goal, lo), hi - 1)
    while lo <= limit < hi and hi - lo > rel_tol * lo and work.pay(VISITS_PER_ITEM * n):
        packed = first_fit_decreasing(sizes, limit)
        if int(packed.max()) < bins:
            best, hi = packed, limit
            if limit <= goal:
                break
        else:
            lo = limit + 1
        limit = (lo + hi) // 2
    if best is not None:
        fill_empty(best, sizes, bins)
    return best


def fill_empty(bin_of: np.ndarray, weights: np.ndarray, bins: int) -> None:
    """Give each empty bin (of 0..bins-1) one item, the heaviest that is not the first of its
    bin, in place; needs len(weights) >= bins. No bin gets heavier."""
    counts = np.bincount(bin_of, minlength=bins)
    empty = np.flatnonzero(counts == 0)
    if empty.size == 0:
        return
    lead = np.full(bins, bin_of.size)  # each bin's first item (np.unique sorts: 38x slower)
    np.minimum.at(lead, bin_of, np.arange(bin_of.size))
    first = np.zeros(bin_of.size, dtype=bool)
    first[lead[counts > 0]] = True
    movable = np.flatnonzero(~first)
    bin_of[movable[descending(weights[movable])][: empty.size]] = empty
