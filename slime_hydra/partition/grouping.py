"""Linear grouping (de la Vega and Lueker, 1981): a step of many items packed through one of
C times fewer. The items, largest first, fall into groups of C; each group's head (its largest)
stands for the group. A packing of the heads into b bins within the cap is copied C times, the
j-th copy taking the j-th item of every group into bins j·b .. j·b + b - 1: no item is larger
than its head, so no copy's bin is heavier than the heads' bin it copies, and the step's
heaviest bin is the heads' heaviest.

What it costs: rounding every item up to its head adds `lost` tokens (at most C times the
largest item less the smallest: the groups' spreads telescope), and the heads get count // C
bins, so the copies miss count mod C bins (filled afterwards by splitting bins). A step is
grouped only where both together take at most SLACK_LOST of the room the step leaves at the
first count that holds it, and `lost` at most a quarter of the tolerance of the step's tokens:
by volume the heads keep most of the step's room at every count, and their mean bin is within
a quarter of the tolerance of the step's (the heads are balanced to what is left of it,
`tolerance`). An argument on volume, not a proof: as without grouping, K above K_lb says the
search did not pack K_lb, not that no plan does.

So the count search and the balancing, whose passes cost O(n) each at scale (a count that
cannot be packed took 2.8 s of repairs at 1M samples on dp4096), run on at least `least` heads
(the partitioner's `group_items`), under 2·`least` where C need not divide a small count step,
whatever the step's size (heads that are still many are grouped again).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from slime_hydra.partition.deal import descending
from slime_hydra.partition.multifit import fill_empty

SLACK_LOST = 1 / 4
"""Of the room the step leaves at the first count that holds its tokens (that many bins at the
cap less its tokens), what the heads may lose: a step nearly full there has little to lose
(16k GRPO samples on dp32, 99.96% full at K_lb, whose rounding took most of its 26k tokens of
room, packed K_lb + 1 from heads of 2,048 and K_lb whole). It replaces 1/32 of a count step's
room (dp·g bins at the cap), which kept steps on few ranks whole whatever their room: on 274
random steps of every family and layout (3 fresh seeds, 1-40k samples) 66 micro-batches above
K_lb against 75, in 13% less time (docs/planner.md, thirtieth round)."""


@dataclass(frozen=True)
class Grouping:
    """The items, largest first, in groups of `copies`."""

    order: np.ndarray
    copies: int

    @classmethod
    def of(
        cls, sizes: np.ndarray, counts: Sequence[int], cap: int, tolerance: float, least: int
    ) -> Grouping | None:
        """The grouping of the most copies (at most len(sizes) // `least` heads, dividing the
        step between `counts`, so that every count has heads' count // copies of its own)
        whose loss is within the limits of the module docstring; None where no grouping of
        two or more copies is."""
        most = min(len(sizes) // least, counts[0]) if least else 0
        if most < 2:
            return None
        total = int(sizes.sum())
        held = bisect_left(counts, -(-total // cap))  # the first count that holds the tokens
        if held == len(counts):
            return None
        limit = SLACK_LOST * (counts[held] * cap - total)
        step = counts[1] - counts[0] if len(counts) > 1 else counts[0]
        # Rounding only adds to what the missed bins lose: the step is sorted only where some
        # copies divide the step and miss few enough bins.
        fits = [c for c in range(most, 1, -1) if step % c == 0 and (counts[0] % c) * cap <= limit]
        if not fits:
            return None
        order = descending(sizes)
        desc = sizes[order]
        for copies in fits:
            lost = copies * int(desc[::copies].sum()) - total
            if (counts[0] % copies) * cap + lost <= limit and lost <= tolerance / 4 * total:
                return cls(order, copies)
        return None

    def heads(self, values: np.ndarray) -> np.ndarray:
        """Each group's value at its head (its largest item)."""
        return values[self.order[:: self.copies]]

    def tolerance(
        self, weights: np.ndarray, head_weights: np.ndarray, bins: int, tolerance: float
    ) -> float:
        """What the heads are balanced to, for the step's heaviest bin (the heads') to stay
        within `tolerance` of the step's bound where the mean bin sets it: the heads' mean bin
        is the step's raised by the weight rounding every item up to its head adds and by the
        bins of the `bins` that no copy fills, and their bound, an integer, is at most a unit
        above it. Without it, 2 of 64 random steps grouped from 8k samples ended 1.0101 over
        their bound (docs/planner.md, thirtieth round). 0 where rounding takes the tolerance."""
        step_mean = int(weights.sum()) / bins
        head_mean = int(head_weights.sum()) / (bins // self.copies)
        return max((1 + tolerance) * step_mean / (head_mean + 1) - 1, 0.0)

    def counts(self, counts: Sequence[int]) -> Sequence[int]:
        """The heads' bin count of each of the step's `counts`."""
        return _HeadCounts(counts, self.copies)

    def spread(
        self, head_bin: np.ndarray, head_bins: int, bins: int, weights: np.ndarray
    ) -> np.ndarray:
        """The bin of each item from the heads' packing into `head_bins` bins: the j-th item of
        each group in copy j of its head's bin. Bins no copy fills (`bins` is at least
        copies × head_bins) and bins of the last, short group's copies that it leaves empty get
        one item each from bins of two or more (multifit.fill_empty: no bin gets heavier)."""
        place = np.arange(self.order.size)
        bin_of = np.empty(self.order.size, dtype=np.int64)
        bin_of[self.order] = (place % self.copies) * head_bins + head_bin[place // self.copies]
        fill_empty(bin_of, weights, bins)
        return bin_of


class _HeadCounts(Sequence[int]):
    """count // copies of each count, ascending, computed as read (a step of many items on few
    ranks allows a million counts)."""

    def __init__(self, counts: Sequence[int], copies: int) -> None:
        self._counts, self._copies = counts, copies

    def __len__(self) -> int:
        return len(self._counts)

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [c // self._copies for c in self._counts[i]]
        return self._counts[i] // self._copies
