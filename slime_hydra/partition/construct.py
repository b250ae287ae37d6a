"""Starting packings into exactly B non-empty bins, vectorised (O(n log n) numpy, no search).

`construct` balances: items heaviest first, one per bin in the first round (no bin stays
empty), then rounds of B items dealt heaviest to the lightest bin while a round can still close
the spread between bins (all but the last LPT_TAIL of many such rounds in snake order, at once;
where the rounds deal every item, the bins of the short last round may instead take the
smallest items in rounds of their own, `_by_count`); then items of medium weight fill each
bin's room below the water level by largest fit (those that fit no room first, to the lightest
bins; where what is left would lift a bin above the level, the rooms are measured up to the
proven bound on the heaviest bin instead), and the light ones (at most `tolerance`/2 of the
level each) are poured by prefix sums, each bin ending within half an item of the level. What
fits nowhere is dealt in rounds to the lightest bins. `fit_rounds` fills to a cap instead
(largest fit in rounds), and `cut_to` cuts a packing of more bins to B. Each may break the cap
(partition.improve repairs it).
"""

from __future__ import annotations

import numpy as np

from slime_hydra.partition.bounds import max_part_lower_bound
from slime_hydra.partition.deal import ascending, count_at_most, descending


def construct(weights: np.ndarray, bins: int, tolerance: float) -> np.ndarray:
    """The bin (0..bins-1) of each item, every bin non-empty (needs len(weights) >= bins), each
    bin near the others unless its own large items lift it; see the module docstring."""
    n = len(weights)
    order = descending(weights)
    w = weights[order]
    bin_of = np.empty(n, dtype=np.int64)
    first = min(bins, n)
    bin_of[order[:first]] = np.arange(first)
    load = np.zeros(bins, dtype=np.int64)
    load[:first] = w[:first]
    start = _snake(order, w, first, bin_of, load)
    while start < n and w[start] > load.max() - load.min():
        _deal(order[start : start + bins], w[start : start + bins], bin_of, load)
        start += bins
    if start >= n:  # the last round may be short
        return _by_count(order, w, bin_of, load)
    level = _level(load, int(w[start:].sum()))
    poured = max(start, int(np.searchsorted(-w, -(tolerance / 2) * level, side="left")))
    if poured > start:  # items that pouring would leave a bin too far off the level
        ids, vals = order[start:poured][::-1], w[start:poured][::-1]  # ascending
        bin_of[ids], load = _fill_to(vals, load, level, weights, bins, tolerance)
    if poured < n:
        pour(order[poured:], w[poured:], bin_of, load)
    return bin_of


def _by_count(order: np.ndarray, w: np.ndarray, bin_of: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Where rounds dealt every item (`bin_of`, bins at `load`) and n is not a multiple of B,
    the n mod B bins that hold one item more: given the smallest items, in rounds of their own
    apart from the other bins', they can end lighter than whole rounds leave them, as samples of
    nearly one size do (2,294-2,948 tokens, 2.3 a micro-batch: the heaviest 1.057 of the proven
    bound by rounds, 1.006 so). Returns the one of the two whose heaviest bin is lighter. Only
    for bins of at most LPT_TAIL items: beyond, one item more is a small share of a bin, and
    these rounds, one at a time, would cost a sort each (1,577 tiny samples on dp1: 2.9x the
    plan)."""
    n, bins = w.size, load.size
    per_bin, more = divmod(n, bins)
    if more == 0 or per_bin > LPT_TAIL:
        return bin_of
    few = (bins - more) * per_bin  # the largest items, per_bin to each of bins - more bins
    place = np.empty(n, dtype=np.int64)  # by position in `w`
    heavy, light = np.zeros(bins - more, dtype=np.int64), np.zeros(more, dtype=np.int64)
    _deal_rounds(np.arange(few), w[:few], place, heavy)
    _deal_rounds(np.arange(few, n), w[few:], place, light)
    if max(int(heavy.max()), int(light.max())) >= int(load.max()):
        return bin_of
    place[few:] += bins - more
    by_count = np.empty(n, dtype=np.int64)
    by_count[order] = place
    return by_count


LPT_TAIL = 8
"""Of construct's rounds of B items, the last ones dealt heaviest to the lightest bin one
round at a time; those before them go in snake order, all at once."""


def _snake(
    order: np.ndarray, w: np.ndarray, start: int, bin_of: np.ndarray, load: np.ndarray
) -> int:
    """Deal whole rounds of B items (`w` heaviest first from `start`) in snake order over the
    bins lightest first, as long as a round can still close the spread between bins and more
    than LPT_TAIL such rounds are left; returns where the rounds one at a time start. Snake
    order costs one numpy pass for all rounds, where a round at a time costs a sort each: a
    step of few bins deals hundreds of rounds."""
    bins = load.size
    rows = (len(w) - start) // bins
    if rows <= LPT_TAIL:
        return start
    by_load = ascending(load)
    got = w[start : start + rows * bins].reshape(rows, bins).copy()
    got[1::2] = got[1::2, ::-1]  # got[r, j]: what the j-th lightest bin (at the start) gets
    after = load[by_load] + np.cumsum(got, axis=0)
    spread = np.concatenate(([load.max() - load.min()], (after.max(1) - after.min(1))[:-1]))
    dealt = np.flatnonzero(w[start : start + rows * bins : bins] <= spread)
    rows = max(0, (int(dealt[0]) if dealt.size else rows) - LPT_TAIL)
    if rows == 0:
        return start
    to = np.tile(by_load, (rows, 1))
    to[1::2] = to[1::2, ::-1]
    bin_of[order[start : start + rows * bins]] = to.ravel()
    load[by_load] = after[rows - 1]
    return start + rows * bins


FILL_STEPS = (0.0, 1.0)
"""Fill levels tried above the proven bound, in units of the tolerance, when the water level
leaves medium items no room."""


def _fill_to(
    vals: np.ndarray, load: np.ndarray, level: float, weights: np.ndarray, bins: int, tol: float
) -> tuple[np.ndarray, np.ndarray]:
    """The bin of each medium item (`vals` ascending) and the bins' loads after: below the
    water level (`_fit_below`), those that fit nowhere dealt to the lightest bins. Where those
    would lift a bin more than tol/2 above the level (a bin's own large item took the room
    they needed), the level rises to the proven bound on the heaviest bin and a little above;
    the filling whose heaviest bin ends lowest wins."""
    goal = (1 + tol / 2) * max(level, int(load.max()))
    best = _spilled(vals, _fit_below(vals, load, int(level)), load)
    top = int(best[1].max())
    if top <= goal:
        return best
    # The bracket's upper end: at most tol/4 above the bound, found in fewer bisection steps.
    bound = max_part_lower_bound(weights, bins, upper=top, rel_tol=tol / 4) * (1 + tol / 4)
    for step in FILL_STEPS:
        again = _spilled(vals, _fit_below(vals, load, int(bound * (1 + step * tol))), load)
        if int(again[1].max()) < top:
            best, top = again, int(again[1].max())
        if top <= goal:
            break
    return best


def _fit_below(vals: np.ndarray, load: np.ndarray, top: int) -> np.ndarray:
    """The bin of each item (`vals` ascending) or -1: those over every bin's room below `top`
    go first, heaviest to the lightest bin (they fit nowhere, so they take the least full
    bins before smaller items fill those), then `largest_fit` into the rooms left."""
    room = np.maximum(top - load, 0)
    got = np.full(vals.size, -1, dtype=np.int64)
    over = np.flatnonzero(vals > room.max())[::-1]
    if over.size:
        trial = load.copy()
        _deal_rounds(over, vals[over], got, trial)
        room = np.maximum(top - trial, 0)
    fit = vals.size - over.size
    got[:fit] = largest_fit(vals[:fit], room)
    return got


def _spilled(vals: np.ndarray, got: np.ndarray, load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each item's bin and the bins' loads (from `load`, left as it is) once the items `got`
    placed (bin >= 0) are in and the others dealt, heaviest first, in rounds to the lightest
    bins."""
    trial = load.copy()
    fits = got >= 0
    np.add.at(trial, got[fits], vals[fits])
    where = got.copy()
    left = np.flatnonzero(~fits)[::-1]
    _deal_rounds(left, vals[left], where, trial)
    return where, trial


def _deal(ids: np.ndarray, vals: np.ndarray, bin_of: np.ndarray, load: np.ndarray) -> None:
    """Items `ids` (at most one per bin, heaviest first), heaviest to the lightest bin."""
    to = ascending(load)[: ids.size]
    bin_of[ids] = to
    load[to] += vals


def _deal_rounds(ids: np.ndarray, vals: np.ndarray, bin_of: np.ndarray, load: np.ndarray) -> None:
    """Items `ids` (heaviest first) dealt in rounds of one per bin by `_deal`."""
    for at in range(0, ids.size, load.size):
        _deal(ids[at : at + load.size], vals[at : at + load.size], bin_of, load)


def _level(load: np.ndarray, left: int) -> float:
    """The water level that `left` more weight reaches over bins at `load`: the T with
    sum(max(T - load, 0)) = left."""
    asc = np.sort(load)
    # With the j lightest bins under water the level is (left + their loads) / j; the first
    # j whose level stays at or below the next bin's load is the one.
    levels = (left + np.cumsum(asc)) / np.arange(1, asc.size + 1)
    below = np.flatnonzero(levels[:-1] <= asc[1:])
    return float(levels[below[0]] if below.size else levels[-1])


def pour(ids: np.ndarray, vals: np.ndarray, bin_of: np.ndarray, load: np.ndarray) -> None:
    """Items `ids` (heaviest first) poured into bins at `load` to one water level (`_pour`),
    each bin ending within half an item of it, and what rounding leaves dealt in rounds to the
    lightest bins; `bin_of` and `load` updated in place."""
    rest = np.flatnonzero(_pour(ids, vals, bin_of, load))
    _deal_rounds(ids[rest], vals[rest], bin_of, load)


def _pour(ids: np.ndarray, vals: np.ndarray, bin_of: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Light items poured, bin after bin by prefix sums, into the room each bin has below the
    water level they fill: an item goes to the bin whose room holds its middle, so a bin ends
    within half an item of the level. Returns a mask of the items left (rounding only)."""
    room = np.maximum(_level(load, int(vals.sum())) - load, 0.0)
    middle = np.cumsum(vals) - vals / 2
    to = np.searchsorted(np.cumsum(room), middle, side="left")
    fits = to < load.size
    bin_of[ids[fits]] = to[fits]
    np.add.at(load, to[fits], vals[fits])
    return ~fits


def largest_fit(vals: np.ndarray, room: np.ndarray) -> np.ndarray:
    """The bin of each item (`vals` ascending) or -1, bins filling their `room` (updated in
    place) in rounds: every bin, roomiest first, takes the largest item left that fits and that
    no roomier bin took (a running minimum over binary searches); first-fit decreasing's rule,
    all bins at once. A bin that the smallest item left does not fit is done (items only
    leave). Stops when no item left fits any room."""
    got = np.full(vals.size, -1, dtype=np.int64)
    left = np.arange(vals.size)
    open_bins = np.arange(room.size)
    while left.size:
        open_bins = open_bins[room[open_bins] >= vals[left[0]]]
        by_room = open_bins[ascending(-room[open_bins])]
        if by_room.size and room[by_room[-1]] >= vals[left[-1]]:
            # Every bin takes the largest item left: the j-th roomiest the j-th largest, no
            # search (few bins and many items fill in many such rounds).
            m = min(by_room.size, left.size)
            items = left[left.size - m :][::-1]
            got[items] = by_room[:m]
            room[by_room[:m]] -= vals[items]
            left = left[: left.size - m]
            continue
        step = np.arange(by_room.size)
        want = count_at_most(vals[left], room[by_room]) - 1
        pick = np.minimum.accumulate(want + step) - step
        fits = pick >= 0
        if not fits.any():
            break
        items = left[pick[fits]]
        got[items] = by_room[fits]
        room[by_room[fits]] -= vals[items]
        keep = np.ones(left.size, dtype=bool)
        keep[pick[fits]] = False
        left = left[keep]
    return got


def fit_rounds(sizes: np.ndarray, bins: int, cap: int) -> np.ndarray:
    """The bin of each item by `largest_fit` under `cap`, after the `bins` largest items open
    the bins; every bin non-empty, over the cap only where items fitted nowhere: those go,
    largest first, to the roomiest bins (for `improve` to repair)."""
    n = len(sizes)
    order = ascending(sizes)
    s = sizes[order]
    placed = np.empty(n, dtype=np.int64)
    placed[n - bins :] = np.arange(bins)[::-1]
    room = np.empty(bins, dtype=np.int64)
    room[::-1] = cap - s[n - bins :]
    placed[: n - bins] = largest_fit(s[: n - bins], room)
    left = np.flatnonzero(placed[: n - bins] < 0)[::-1]  # largest first
    _deal_rounds(left, s[left], placed, cap - room)  # the roomiest bin is the least full
    bin_of = np.empty(n, dtype=np.int64)
    bin_of[order] = placed
    return bin_of


def cut_to(bin_of: np.ndarray, sizes: np.ndarray, bins: int) -> np.ndarray:
    """A packing of more than `bins` bins cut to `bins`: the items of its lightest bins dealt,
    largest first, in rounds to the lightest of the bins kept (over the cap where they fit
    nowhere, for `improve` to repair)."""
    have = int(bin_of.max()) + 1
    load = np.bincount(bin_of, weights=sizes, minlength=have).astype(np.int64)
    keep = np.zeros(have, dtype=bool)
    keep[ascending(load)[have - bins :]] = True
    out = np.where(keep[bin_of], (np.cumsum(keep) - 1)[bin_of], -1)
    left = np.flatnonzero(out < 0)
    left = left[descending(sizes[left])]
    kept = out >= 0
    _deal_rounds(left, sizes[left], out, np.bincount(out[kept], sizes[kept], bins).astype(np.int64))
    return out
