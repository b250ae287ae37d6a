"""MULTIFIT's packing (Coffman, Garey and Johnson, 1978): a balanced packing into a given number
of bins found as a bin packing, first-fit decreasing under a load limit (`ffd_within`).

Where bins hold one large item and a few small ones (samples just over half the cap beside
short ones, GRPO steps of two or three samples a micro-batch), exchanges of one item at a time
can stall above the bound while FFD under a limit just above it packs the whole step: on three
such steps of 3,034 samples in 1,340 micro-batches the exchanges stopped 2.5-3.5% above the
bound, and FFD under a bisected limit (eight packings) 0.03-0.04% above it. The packer's
balancing tries one limit, its goal; the bisection (`multifit`) is the refit's last start,
with what its repairs left (partition.balanced). FFD is pure Python, so its cost is charged
to the work budget like the exchanges' (VISITS_PER_ITEM).
"""

from __future__ import annotations

import numpy as np

from slime_hydra.partition.base import Work
from slime_hydra.partition.deal import descending
from slime_hydra.partition.greedy import first_fit_decreasing_within

VISITS_PER_ITEM = 10
"""What one item of first-fit decreasing costs in `Work` item visits: its pure-Python loop took
650-1,100 ns an item where an exchange pass took ~100 ns a visit, on the same loaded machine
(2026-12-01, steps of 3-16k samples)."""


def ffd_within(sizes: np.ndarray, bins: int, limit: int, work: Work) -> np.ndarray | None:
    """The bin (0..bins-1) of each item under first-fit decreasing into bins of load at most
    `limit` (at least the largest item), where it needs at most `bins` of them: its empty bins
    get an item each (len(sizes) >= bins), so the heaviest bin is at most the limit. None where
    it needs more, or where `work` cannot pay for the packing (VISITS_PER_ITEM visits an item;
    none is started that it cannot pay for)."""
    if not work.affords(VISITS_PER_ITEM * len(sizes)):
        return None
    packed, placed = first_fit_decreasing_within(sizes, limit, bins)
    work.charge(VISITS_PER_ITEM * placed)  # FFD stops once the bins cannot hold the rest
    if packed is None:
        return None
    fill_empty(packed, sizes, bins)
    return packed


def multifit(sizes: np.ndarray, bins: int, low: int, high: int, work: Work) -> np.ndarray | None:
    """MULTIFIT's bisection: `ffd_within`'s packing under the least limit in (low, high) at
    which it packs, as far as a bisection finds (FFD need not pack every limit above one it
    packs: the packing returned is one it made), while `work` pays; None where no limit it
    tried packs. It costs at most (high - low - 1).bit_length() packings."""
    best = None
    while high - low > 1 and work.affords(VISITS_PER_ITEM * len(sizes)):
        mid = (low + high) // 2
        packed = ffd_within(sizes, bins, mid, work)
        if packed is None:
            low = mid
        else:
            best, high = packed, mid
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
