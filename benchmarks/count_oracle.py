"""Whether a step has a cap-safe packing into fewer bins than the planner found: a whole-step
repair with a large budget, for bench_planner to tell its misses of K_lb from counts nobody
can reach. A packing found is checked, so "found" proves a plan exists at that count; "not
found" proves nothing.

The repair starts from first-fit decreasing's packing cut to the count (partition.balanced
.cut_to) and from largest fit in rounds (fit_rounds), and makes passes of exchanges in which
every bin over the cap is searched against every bin with room: the move or one-for-one swap
that lowers the total excess over the cap most (a shift d from a bin of excess e into one of
room r gains min(d, e) - max(d - r, 0): the excess may move on to where a later pass finds
room), among equal gains the light bin left fullest within the cap (best fit: the large rooms
stay for large excesses; leaving it emptiest instead finds 3 where this finds 5 on one seed),
one exchange per bin a pass. On GRPO steps 98-99% full where the planner's paired repair stalls
thousands of tokens over the cap, this one packs K_lb (docs/planner.md, tenth round). It is too
slow per pass at scale to be the planner's (0.7 s a pass at 1M samples).
"""

from __future__ import annotations

import numpy as np

from slime_hydra.partition.balanced import cut_to, fit_rounds
from slime_hydra.partition.deal import ascending
from slime_hydra.partition.exchange import Exchanges, apply_exchanges
from slime_hydra.partition.greedy import first_fit_decreasing

PASSES = 200  # passes a start may take (about 0.5 ms each at 4k samples)
WINDOW = (-2, -1, 0, 1)  # light items tried around the shift that ends the excess exactly
TIERS = (0.0, 0.9)  # the window among all bins with room, and the roomiest tenth


def packs(sizes: np.ndarray, bins: int, cap: int, passes: int = PASSES) -> bool:
    """Whether the repair packs `sizes` (each <= cap) into exactly `bins` non-empty bins with
    every bin of two or more items within `cap`."""
    if bins <= 0 or len(sizes) < bins:
        return False
    ffd = first_fit_decreasing(sizes, cap)
    if int(ffd.max()) < bins:  # FFD needs no more bins: split its bins until there are enough
        return True
    starts = (cut_to(ffd, sizes, bins), fit_rounds(sizes, bins, cap))
    return any(_repaired(start, sizes, bins, cap, passes) for start in starts)


def _repaired(bin_of: np.ndarray, sizes: np.ndarray, bins: int, cap: int, passes: int) -> bool:
    load = np.bincount(bin_of, weights=sizes, minlength=bins).astype(np.int64)
    counts = np.bincount(bin_of, minlength=bins)
    for _ in range(passes):
        if not ((load > cap) & (counts > 1)).any():
            break
        ex = _exchanges(bin_of, sizes, load, counts, cap)
        if ex.give.size == 0:
            return False
        apply_exchanges(ex, bin_of, sizes, load, counts)
    # The check, from the packing alone.
    final = np.bincount(bin_of, weights=sizes, minlength=bins)
    counts = np.bincount(bin_of, minlength=bins)
    return bool((counts > 0).all() and ((final <= cap) | (counts == 1)).all())


def _exchanges(
    bin_of: np.ndarray, sizes: np.ndarray, load: np.ndarray, counts: np.ndarray, cap: int
) -> Exchanges:
    """The exchanges of one pass."""
    over = (load > cap) & (counts > 1)
    room = np.where(over, 0, np.maximum(cap - load, 0))
    hi = np.flatnonzero(over[bin_of])
    li = np.flatnonzero(room[bin_of] > 0)
    if hi.size == 0 or li.size == 0:
        return Exchanges.none(0)
    li = li[ascending(sizes[li])]
    x = sizes[hi]
    excess = (load - cap)[bin_of[hi]]
    # The smallest y whose bin takes x within its room (y + r >= x), then the window.
    reach = np.maximum.accumulate(sizes[li] + room[bin_of[li]])
    cands = [li[np.minimum(np.searchsorted(reach, x), li.size - 1)][:, None]]
    li_room = room[bin_of[li]]
    rooms = np.sort(room[room > 0])
    for q in TIERS:
        tier = li[li_room >= rooms[int(q * (rooms.size - 1))]]
        near = np.searchsorted(sizes[tier], x - excess)[:, None] + np.asarray(WINDOW)
        cands.append(tier[np.clip(near, 0, tier.size - 1)])
    take = np.concatenate(cands, axis=1)
    to = bin_of[take]
    d = x[:, None] - sizes[take]
    # A move: to the bin of least room that holds the whole item.
    open_bins = np.flatnonzero(room > 0)
    open_bins = open_bins[ascending(room[open_bins])]
    fit = np.minimum(np.searchsorted(room[open_bins], x), open_bins.size - 1)
    to = np.concatenate((to, open_bins[fit][:, None]), axis=1)
    take = np.concatenate((take, np.full((hi.size, 1), -1, dtype=np.int64)), axis=1)
    d = np.concatenate((d, x[:, None]), axis=1)
    ok = (d > 0) & ((take >= 0) | (counts[bin_of[hi]] > 1)[:, None])
    gain = np.where(ok, np.minimum(d, excess[:, None]) - np.maximum(d - room[to], 0), 0)
    after = load[to] + d
    fill = np.where(after <= cap, after, 0)  # among equal gains, the light bin left fullest
    score = np.where(gain > 0, gain * (int(np.abs(after).max()) + 1) + fill, -1)
    col = score.argmax(axis=1)
    row = np.arange(hi.size)
    best, to, take = score[row, col], to[row, col], take[row, col]
    keep = np.flatnonzero(best > 0)
    heavy = bin_of[hi]
    # One per heavy bin, then one per light bin, the largest gain first; ties by item.
    keep = keep[np.lexsort((hi[keep], -best[keep], heavy[keep]))]
    keep = keep[np.concatenate(([True], heavy[keep][1:] != heavy[keep][:-1]))[: keep.size]]
    keep = keep[np.lexsort((hi[keep], -best[keep], to[keep]))]
    keep = keep[np.concatenate(([True], to[keep][1:] != to[keep][:-1]))[: keep.size]]
    return Exchanges(heavy[keep], to[keep], hi[keep], take[keep], 0)
