"""Balanced packing into exactly B non-empty bins under a cap, vectorised, with bounded work.

`construct` is O(n log n) numpy: items heaviest first, one per bin in the first round (no bin
stays empty), then rounds of B items dealt heaviest to the lightest bin while a round can still
close the spread between bins (all but the last LPT_TAIL of many such rounds in snake order, at
once; where the rounds deal every item, the bins of the short last round may instead take the
smallest items in rounds of their own, `_by_count`); then items of medium weight fill each
bin's room below the water level by largest fit (those that fit no room first, to the lightest
bins; where what is left would lift a bin above the level, the rooms are measured up to the
proven bound on the heaviest bin instead), and the light ones (at most `tolerance`/2 of the
level each) are poured by prefix sums, each bin ending within half an item of the level. What
fits nowhere is dealt in rounds to the lightest bins.

`improve` is anytime: each pass pairs the bins above the goal, heaviest first, with the
lightest bins and applies, to every pair at once, the move or swap of one item whose shift
brings the pair nearest each other (`exchange.best_exchanges`). A pass never makes a bin
heavier than its pair's heavier bin was, nor a bin of two or more items break the cap, nor a
bin empty; over-cap bins are repaired first by the same exchanges on sizes, and what they leave
over the cap by partition.repair, whose passes search every bin with room. Passes run until
the heaviest bin is within the goal, no pair can improve, or the work budget (`Work`, counted
in item visits, so every machine plans the same) is spent.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from slime_hydra.partition.base import PASS_OVERHEAD, Work
from slime_hydra.partition.bounds import max_part_lower_bound
from slime_hydra.partition.deal import ascending, count_at_most, descending, run_starts
from slime_hydra.partition.exchange import (
    Exchanges,
    apply_exchanges,
    best_exchanges,
    bulk_moves,
    bulk_visits,
    visits,
)
from slime_hydra.partition.greedy import first_fit_decreasing
from slime_hydra.partition.grouping import Grouping
from slime_hydra.partition.multifit import VISITS_PER_ITEM, fill_empty, multifit
from slime_hydra.partition.repair import repair, spill

PARTNERS = 4
"""Light bins each heavy bin tries per pass (while the pool has that many per heavy bin); in
balancing, doubled after each pass in which the heaviest bin found no exchange (so it meets
every bin in O(log) passes, not one pass per PARTNERS bins: where the lightest bins cannot take
from it, e.g. micro-batches of two large samples beside three-sample ones, 12 fresh draws of
truncated 2k on dp4 took 8.1 -> 6.9 ms a step, the third family's worst 1.0111 -> 1.0063 of
its bound). In a repair only after a pass with no exchange at all: wider passes cost more for
the same gain, and `_hopeless`, which reads that rate, gave up on a count the repair packs (16k
GRPO samples on dp64, 99.8% full); a pass in vain has no rate, and four partners a pass spent
a count search's budget (truncated 2k on dp4: 10.6 -> 6.3 ms a step, the same count).
On bench_planner's 48 cases of seed 11 the worst largest micro-batch over its
bound was 1.071 with 1 partner, 1.051 with 4 and 1.087 with 8 (the partners of the heaviest
bin spread wider)."""

NEAR_PASSES = 4
"""What the refit gives the plan as it is (`partition.repair`) before it packs the step again,
in passes of one visit a sample (NEAR_PASSES × (n + PASS_OVERHEAD) visits): where balancing
stopped just over the tolerance a few exchanges end it (a truncated step of 4,096 samples on
dp32 at 1.0109 of its bound: 0.6 ms, where largest fit's refit took 8 ms), and where it stopped
far over they fail fast. A pass over many heavy items costs more than that, so there the plan
gets none; sized by the heavy items' pass cost instead, steps over 1.01 of their bound rose
from 4 to 12 of 456 (docs/planner.md, twenty-first round): the near repair rarely packs there
and spends what largest fit's refit needs."""


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
        left = poured + np.flatnonzero(_pour(order[poured:], w[poured:], bin_of, load))
        _deal_rounds(order[left], w[left], bin_of, load)
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


def improve(
    bin_of: np.ndarray,
    sizes: np.ndarray,
    weights: np.ndarray,
    bins: int,
    cap: int,
    goal: float,
    work: Work,
) -> bool:
    """Repair over-cap bins (paired exchanges; where they stop short, partition.repair's
    whole-step passes), then lower the heaviest bins toward `goal`, in place, within `work`.
    Returns whether every bin of two or more items is within `cap`."""
    state = _State.of(bin_of, sizes, weights, bins)
    if not _passes(state, sizes, cap, cap, work, repair=True):
        if not (work.left and repair(bin_of, sizes, bins, cap, work)):
            return False
        state = _State.of(bin_of, sizes, weights, bins)
    _passes(state, weights, cap, goal, work, repair=False)
    return True


@dataclass
class _State:
    """A packing and its per-bin totals, kept up to date by every exchange."""

    bin_of: np.ndarray
    sizes: np.ndarray
    weights: np.ndarray
    size_load: np.ndarray
    weight_load: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, bin_of: np.ndarray, sizes: np.ndarray, weights: np.ndarray, bins: int) -> _State:
        size_load = np.bincount(bin_of, weights=sizes, minlength=bins).astype(np.int64)
        weight_load = (
            size_load
            if weights is sizes
            else np.bincount(bin_of, weights=weights, minlength=bins).astype(np.int64)
        )
        counts = np.bincount(bin_of, minlength=bins)
        return cls(bin_of, sizes, weights, size_load, weight_load, counts)

    def load(self, values: np.ndarray) -> np.ndarray:
        return self.size_load if values is self.sizes else self.weight_load

    def exchanges(
        self,
        values: np.ndarray,
        pairs: tuple[np.ndarray, np.ndarray],
        gap: np.ndarray,
        room: np.ndarray,
        cap: int,
        movable: np.ndarray,
    ) -> Exchanges:
        """`exchange.best_exchanges` over this packing for the (heavy, light) bin `pairs`."""
        heavy, light = pairs
        return best_exchanges(
            self.bin_of,
            values,
            self.sizes,
            heavy,
            light,
            gap,
            room,
            self.size_load,
            self.counts,
            cap,
            movable,
        )

    def apply(self, ex: Exchanges) -> None:
        apply_exchanges(ex, self.bin_of, self.sizes, self.size_load, self.counts)
        if self.weight_load is not self.size_load:
            d = ex.shift(self.weights)
            np.subtract.at(self.weight_load, ex.heavy, d)
            np.add.at(self.weight_load, ex.light, d)


def _passes(
    state: _State,
    values: np.ndarray,
    cap: int,
    goal: float,
    work: Work,
    repair: bool,
) -> bool:
    """Exchange passes on `values` until every open bin is at most `goal` (True), or no pair
    can improve or the work is spent (False); each pass takes only the pairs the work left pays
    for. In repair a bin of one item is done. Both stop where the work left cannot remove the
    excess over `goal` at the last pass's rate (`_hopeless`)."""
    load = state.load(values)
    n = len(state.bin_of)
    movable = np.ones(n, dtype=bool)
    stalled = stalls = 0  # partners the heaviest bin tried in vain: in all, and passes
    rotation = 0
    while True:
        over = load > goal
        if repair:
            over &= state.counts > 1
        heavy = np.flatnonzero(over)
        if heavy.size == 0:
            return True
        pool = np.flatnonzero(~over)
        if not work.left or pool.size == 0:
            return False
        heavy = heavy[descending(load[heavy])]  # ties by bin: flatnonzero is ascending
        pool = pool[ascending(load[pool])]
        m = min(heavy.size, pool.size)
        heavy = heavy[:m]
        tries = max(1, min(PARTNERS << min(stalls, 30), pool.size // m))
        light = pool[(np.arange(m * tries) + rotation) % pool.size]
        heavy = np.tile(heavy, tries)
        # Only the pairs the work left pays for, first partners first.
        paid = work.paid(visits(np.cumsum(state.counts[heavy]), np.cumsum(state.counts[light]), n))
        if paid == 0:
            return False
        heavy, light = heavy[:paid], light[:paid]
        excess = float((load[over] - goal).sum())
        spent = work.spent
        gap = load[heavy] - load[light]
        room = cap - load[light] if repair else gap
        ex = state.exchanges(values, (heavy, light), gap, room, cap, movable)
        work.charge(ex.visited)
        top_moved = bool((ex.heavy == heavy[0]).any())
        if ex.give.size:
            state.apply(ex)
            if _hopeless(load[over], goal, excess, work, work.spent - spent):
                return False
        if top_moved:
            stalled = stalls = 0
        else:  # the heaviest bin found no exchange: it tries the next bins, in balancing
            # twice as many each time; a repair only after a pass with no exchange at all
            # (otherwise it keeps its pace: `_hopeless` reads its rate)
            stalls += not repair or ex.give.size == 0
            stalled += m * tries
            rotation += m * tries
            if stalled >= pool.size:
                return False


def _hopeless(was_over: np.ndarray, goal: float, excess: float, work: Work, cost: int) -> bool:
    """Whether the passes cannot end within their budget at the rate of the pass just made,
    which cost `cost` visits and started from `excess` over `goal` in the bins whose loads are
    now `was_over`: the budget left, spent at that rate, removes less than the excess left.
    Passes only slow down as the easy exchanges are made, so this stops a repair of a count
    that it cannot pack, or balancing that cannot reach its goal (a step of full bins), after
    a few passes, not after its whole budget."""
    left = float(np.maximum(was_over - goal, 0).sum())
    return work.outpaced(left, excess - left, cost)


def even_groups(
    bin_of: np.ndarray,
    sizes: np.ndarray,
    weights: np.ndarray,
    groups: int,
    cap: int,
    tolerance: float,
    work: Work,
    fixed: np.ndarray | None = None,
) -> None:
    """Even the weight of groups of bins (group r: bins r·k .. r·k + k - 1), in place, until the
    heaviest group is within `tolerance` of the mean, no exchange helps or `work` is spent.

    Each pass pairs the heaviest groups with the lightest, and within a pair the heavier
    group's bins, heaviest first, with the lighter group's, lightest first. Every bin pair
    moves its lightest items up to 1/(2k) of the groups' gap; where none can, the pair of
    groups makes the one exchange, of all its bin pairs, that brings them nearest (a shift in
    (0, gap)). So the heavier group gets lighter and no bin heavier than the heaviest was.
    It stops where the work left cannot bring the groups above the goal at the start down to
    it at the rate of all its passes so far (`_hopeless`; a pass's own rate swings between bulk
    moves and exchanges): a step whose isolated over-cap samples leave the other ranks'
    micro-batches at the cap spent its whole budget for 0.4%.
    """
    bins = int(bin_of.max()) + 1 if bin_of.size else 0
    k = bins // groups
    if groups < 2 or k == 0:
        return
    movable = np.ones(len(bin_of), dtype=bool) if fixed is None else ~fixed
    locked = np.zeros(bins, dtype=bool)
    if fixed is not None:
        locked[bin_of[fixed]] = True
    state = _State.of(bin_of, sizes, weights, bins)
    load = state.weight_load
    ceiling = int(load.max())
    n = len(bin_of)
    # No group weighs less than the mean, than the heaviest item, or than its locked bins and
    # one of the lightest items in each of its other bins (no bin goes empty); nor, where
    # those leave passes to run, than the proven bound on the heaviest of `groups` parts of
    # the items (whole items: 2,857 equal samples on dp48 hold 60 on some rank).
    fixed_load = np.where(locked, load, 0).reshape(groups, k)
    open_bins = (~locked).reshape(groups, k).sum(1)
    floor = max(
        int(load.sum()) / groups,
        int(weights.max()),
        int((fixed_load.sum(1) + open_bins * int(weights.min())).max()),
    )
    goal = (1 + tolerance) * floor
    group_load = load.reshape(groups, k).sum(1)
    if group_load.max() > goal:  # the proven bound, where the cheap floor leaves passes to run
        top = int(group_load.max())
        floor = max(floor, max_part_lower_bound(weights, groups, upper=top, rel_tol=tolerance))
        goal = (1 + tolerance) * floor
    above = group_load > goal
    excess, spent = float((group_load[above] - goal).sum()), work.spent
    rotation = 0
    while work.left:
        group_load = load.reshape(groups, k).sum(1)
        if group_load.max() <= goal:
            return
        over = group_load * groups > (1 + tolerance) * int(group_load.sum())
        heavy = np.flatnonzero(over)
        pool = np.flatnonzero(~over)
        heavy = heavy[descending(group_load[heavy])]
        pool = pool[ascending(group_load[pool])]
        m = min(heavy.size, pool.size)
        heavy = heavy[:m]
        light = pool[(np.arange(m) + rotation) % pool.size]
        mine = load.reshape(groups, k)
        h_bins = heavy[:, None] * k + np.argsort(-mine[heavy], axis=1, kind="stable")
        l_bins = light[:, None] * k + np.argsort(mine[light], axis=1, kind="stable")
        gap = np.repeat(group_load[heavy] - group_load[light], k)
        h_bins, l_bins = h_bins.ravel(), l_bins.ravel()
        open_ = ~locked[h_bins] & ~locked[l_bins]
        h_bins, l_bins, gap = h_bins[open_], l_bins[open_], gap[open_]
        # Only the bin pairs the budget pays for (bulk moves, then exchanges), heaviest first.
        held = np.cumsum(state.counts[h_bins])
        paid = work.paid(
            bulk_visits(held, n) + visits(held, np.cumsum(state.counts[l_bins]), n), passes=2
        )
        if paid == 0:
            return
        h_bins, l_bins, gap = h_bins[:paid], l_bins[:paid], gap[:paid]
        room = ceiling - load[l_bins]
        ex = bulk_moves(  # each bin pair at most 1/(2k) of the gap: the pair together <= 1/2
            state.bin_of,
            weights,
            sizes,
            h_bins,
            l_bins,
            np.minimum(gap // (2 * k), room),
            cap - state.size_load[l_bins],
            state.counts,
            movable,
        )
        work.charge(ex.visited)
        if ex.give.size == 0:  # one exchange per pair of groups, the best of its bin pairs
            ex = state.exchanges(weights, (h_bins, l_bins), gap, room, cap, movable)
            work.charge(ex.visited)
            ex = _one_per_group(ex, weights, group_load, k)
        top = heavy[0]
        if ex.give.size:
            state.apply(ex)
            was_above = load.reshape(groups, k).sum(1)[above]
            if _hopeless(was_above, goal, excess, work, work.spent - spent):
                return
        if not bool((ex.heavy // k == top).any()):  # the heaviest tries the next partner
            rotation += 1
            if rotation >= pool.size:
                return


def _one_per_group(ex: Exchanges, weights: np.ndarray, group_load: np.ndarray, k: int) -> Exchanges:
    """Of `ex` (one exchange per heavy bin), the one per heavy group that leaves the pair of
    groups nearest each other."""
    if ex.give.size == 0:
        return ex
    group = ex.heavy // k
    gap = group_load[group] - group_load[ex.light // k]
    d = ex.shift(weights)
    kept = np.minimum(d, gap - d)
    order = np.lexsort((ex.heavy, -kept, group))
    first = order[run_starts(group[order])]
    return Exchanges(ex.heavy[first], ex.light[first], ex.give[first], ex.take[first], ex.visited)


@dataclass(frozen=True)
class BalancedPacker:
    """The default packer of dynamic batching (config: batching.partitioner): items into the
    fewest non-empty bins it can under the cap, of the counts allowed, as even as the work
    budget allows."""

    tolerance: float = 0.01
    """Stop balancing once the heaviest bin is within this fraction of its lower bound."""
    budget: int = 100_000
    """Improvement work per step, in item visits (a pass also costs PASS_OVERHEAD): 40-60 ns
    each on a current x86 core, so the default is about 5 ms; 0 (with budget_per_sample 0): no
    exchanges at all."""
    budget_per_sample: int = 2 * VISITS_PER_ITEM
    """More work for balancing the micro-batches, per sample of the step: two MULTIFIT
    packings' worth (VISITS_PER_ITEM a sample each), which a fixed budget stops paying for from
    7,500 samples a step, where the exchanges alone stall 2-4% above the bound."""
    repair_budget_per_sample: int = 10 * VISITS_PER_ITEM
    """Work for the whole-step repairs, per sample of the step besides its `budget`, once for
    the count search's cap repairs, spent only where the constructions break the cap at the
    first count, and once for the refit of a balancing that ends over the tolerance. One
    micro-batch fewer per rank saves more step time than this costs (at most ~5 µs a sample).
    On 144 bench_planner cases (314 steps) 20 a sample left 29 steps above K_lb, 50 left 21,
    100 left 17 and 200 left 16 (docs/planner.md, eleventh round)."""

    group_items: int = 16_384
    """Steps of at least twice this many samples are packed through the heads of groups of
    similar samples, at least this many (partition.grouping), where that loses too little room
    to risk a count or the tolerance; 0: never. 16k samples a step are planned in the
    target's 40 ms on their own; at 1M samples on dp4096 the count search of the whole step
    took 2.8 s where it could not pack, that of the heads a few ms (docs/planner.md)."""

    def __call__(
        self,
        sizes: np.ndarray,
        weights: np.ndarray,
        counts: Sequence[int],
        cap: int,
        work: Work,
    ) -> tuple[int, np.ndarray] | None:
        """The first bin count of `counts` (ascending) these items fill, non-empty and within
        the cap (every size <= cap), as far as the constructions below find, and the bin of
        each item; None if none. The first count gets the balanced construction, or where it
        breaks the cap largest fit in rounds. Where both fail, first-fit decreasing's own count
        is packable (it packs every count from its own up) and the counts below it are
        bisected with the constructions and the repairs (of FFD's packing cut to the count,
        whose bins are full, the whole-step repair of partition.repair, first within the
        step's `budget`; of largest fit: paired exchanges, then the whole-step repair; the
        cut's repair resumed), so a step tries O(log) counts, not every one up to it; a count
        whose repairs stop over the cap is not wasted: the better of its two starts, its bins'
        excess shed into new bins (partition.repair.spill), packs a count that lowers the top
        of the bisection where it is below it. The repairs share one budget of their own
        (`_repairs`), so a count that cannot be packed leaves the balancing its budget, and
        the search costs at most that in exchanges besides its constructions and the first
        cut repairs; at FFD's own count the balanced construction repaired (within the
        step's `budget`) and largest fit still go first: FFD fills its bins to the cap and
        leaves its last ones nearly empty. The plan found
        is then balanced within `work`: exchanges with half of it; where they stop above the
        goal, by tokens, MULTIFIT (partition.multifit) below the heaviest bin they reached;
        exchanges again; where the heaviest bin still ends over the tolerance, the refit
        (`_refit`) with a repairs' budget of its own (where `work` has any budget: a call
        with none, count=fastest's constructions of its candidate counts, balances nothing).
        A step of at least 2 × `group_items` items is packed so through its groups' heads
        (partition.grouping) and the heads' packing copied, where that loses too little
        room."""
        if not counts or len(sizes) < counts[0]:
            return None
        groups = Grouping.of(sizes, counts, cap, self.tolerance, self.group_items)
        if groups is not None:
            return self._grouped(sizes, weights, counts, cap, work, groups)

        # Each count's starts are built once: a check with Work(0) leaves them as they are, and
        # the bisection repairs a count's starts at most once, never the count it ends at.
        @cache
        def built(at: int) -> np.ndarray:
            return construct(weights, counts[at], self.tolerance)

        @cache
        def fitted(at: int) -> np.ndarray:
            return fit_rounds(sizes, counts[at], cap)

        def packed(start: np.ndarray, at: int, work: Work) -> np.ndarray | None:
            return start if improve(start, sizes, weights, counts[at], cap, cap, work) else None

        def full(at: int) -> bool:
            return self._full(sizes, weights, counts[at], cap)

        def spilled(at: int, *starts: np.ndarray) -> tuple[int, np.ndarray | None]:
            """The first count the best of `starts` (counts[at] bins, left over the cap by
            their repairs) fills once its bins shed their excess into new ones, and that
            packing; (len(counts), None) where no count takes it."""
            shed = [start.copy() for start in starts]
            got = [spill(start, sizes, counts[at], cap) for start in shed]
            best = int(np.argmin(got))
            above = bisect_left(counts, got[best])
            if above == len(counts) or len(sizes) < counts[above]:
                return len(counts), None
            fill_empty(shed[best], weights, counts[above])
            return above, shed[best]

        def ffd_at(at: int) -> np.ndarray:  # FFD's packing, where it needs at most counts[at]
            bin_of = ffd.copy()
            fill_empty(bin_of, weights, counts[at])
            return bin_of

        ffd = first_fit_decreasing(sizes, cap) if full(0) else None
        if ffd is not None and int(ffd.max()) < counts[0]:
            bin_of = ffd_at(0)
        else:
            bin_of = None if full(0) else packed(built(0), 0, Work(0))
            if bin_of is None:
                bin_of = packed(fitted(0), 0, Work(0))
        at = 0
        if bin_of is None:
            ffd = first_fit_decreasing(sizes, cap) if ffd is None else ffd
            fits = bisect_left(counts, int(ffd.max()) + 1)  # the first count FFD fills
            lo, hi = 0, fits
            repairs = self._repairs(len(sizes))
            while lo < hi:
                mid = (lo + hi) // 2
                got = None if mid == 0 or full(mid) else packed(built(mid), mid, Work(0))
                if got is None:
                    # FFD's bins are full (paired exchanges find no room there): its cut gets the
                    # whole-step repair within the step's budget first, which packs or stalls
                    # fast (4k GRPO samples on dp32: 1 ms, where largest fit's repair spent 11
                    # ms in vain), then largest fit's repair, then the cut's repair resumes.
                    cut = cut_to(ffd, sizes, counts[mid])
                    got = cut if repair(cut, sizes, counts[mid], cap, Work(self.budget)) else None
                    if got is None:
                        got = packed(fitted(mid), mid, repairs)
                    if got is None:
                        got = cut if repair(cut, sizes, counts[mid], cap, repairs) else None
                if got is None:
                    # Where the repairs stopped, the count they missed may be above this one
                    # and below FFD's: the starts shed their excess into a few new bins.
                    lo = mid + 1
                    above, shed = spilled(mid, cut, fitted(mid))
                    if above < hi:
                        bin_of, hi = shed, above
                else:
                    bin_of, hi = got, mid
            at = hi
            if bin_of is None:  # FFD's own count: the constructions, else FFD's packing
                if at == len(counts) or len(sizes) < counts[at]:
                    return None
                if not full(at):
                    # The construction's repair gets the step's budget alone: at 1M samples the
                    # repairs' per-sample budget took 2-3 s, FFD's packing then balanced ~1 s.
                    bin_of = packed(built(at), at, Work(self.budget))
                    if bin_of is None:
                        bin_of = packed(fitted(at), at, Work(0))
                if bin_of is None:
                    bin_of = ffd_at(at)
        bins = counts[at]
        goal = self._goal(weights, bin_of, bins)
        half = Work(work.spent + (work.budget - work.spent) // 2, work.spent)
        improve(bin_of, sizes, weights, bins, cap, goal, half)
        work.spent = half.spent
        top = int(np.bincount(bin_of, weights=weights, minlength=bins).max())
        if top > goal:
            tokens = np.array_equal(weights, sizes)  # balanced by tokens: loads are the sizes
            if tokens:
                low = int(goal / (1 + self.tolerance / 2))  # the bound `goal` was set from
                refit = multifit(sizes, bins, low, top, int(goal), self.tolerance / 4, work)
                bin_of = bin_of if refit is None else refit
            improve(bin_of, sizes, weights, bins, cap, goal, work)
            if tokens and work.budget:  # none where the call asks for no balancing at all
                bin_of = self._refit(sizes, bin_of, bins, self._repairs(len(sizes)))
        return bins, bin_of

    def _grouped(
        self,
        sizes: np.ndarray,
        weights: np.ndarray,
        counts: Sequence[int],
        cap: int,
        work: Work,
        groups: Grouping,
    ) -> tuple[int, np.ndarray] | None:
        """The step packed through its groups' heads (partition.grouping) with the step's
        `work`: the heads' count search and balancing are the step's."""
        head_sizes = groups.heads(sizes)
        head_weights = head_sizes if weights is sizes else groups.heads(weights)
        head_counts = groups.counts(counts)
        found = self(head_sizes, head_weights, head_counts, cap, work)
        if found is None:
            return None
        head_bins, head_bin = found
        bins = counts[bisect_left(head_counts, head_bins)]
        return bins, groups.spread(head_bin, head_bins, bins, weights)

    def _refit(self, sizes: np.ndarray, bin_of: np.ndarray, bins: int, work: Work) -> np.ndarray:
        """Where the heaviest bin is still over the tolerance of the proven bound, T = (1 +
        tolerance) × bound: the packing repaired to T as its cap (partition.repair, within
        `work`), first as it is for NEAR_PASSES passes, then from largest fit in rounds under
        T, if that packs; else `bin_of`, unchanged.
        Exchanges of one item at a time stall in local optima where bins hold few items, and
        MULTIFIT's first-fit decreasing under T needs more bins; the repair searches every bin
        with room. On 47 steps of the bench's random cases ending 1.0102-1.056 over their bound
        (truncated and around-cap/3 steps of 3-5 samples a micro-batch), it packed 41 within
        the repairs' budget; the goal's half tolerance as T packed 24 (docs/planner.md). It has
        a budget of its own: after a count search that could not pack K_lb had spent its
        repairs' budget, a truncated step of 4,743 samples on dp3 stayed 1.97% over."""
        top = int(np.bincount(bin_of, weights=sizes, minlength=bins).max())
        bound = max_part_lower_bound(sizes, bins, upper=top, rel_tol=self.tolerance / 4)
        limit = int((1 + self.tolerance) * bound)
        if top <= limit:
            return bin_of
        # limit < top <= cap: a packing within the limit is within the cap.
        near = bin_of.copy()
        near_passes = NEAR_PASSES * (len(sizes) + PASS_OVERHEAD)
        first = Work(min(work.budget, work.spent + near_passes), work.spent)
        packed = repair(near, sizes, bins, limit, first)
        work.spent = first.spent
        if packed:
            return near
        refit = fit_rounds(sizes, bins, limit)
        return refit if repair(refit, sizes, bins, limit, work) else bin_of

    def _repairs(self, n: int) -> Work:
        """The whole-step repairs' budget for `n` items: the step's `budget` and
        `repair_budget_per_sample` for each item."""
        return Work(self.budget + self.repair_budget_per_sample * n)

    def _full(self, sizes: np.ndarray, weights: np.ndarray, bins: int, cap: int) -> bool:
        """Whether every packing of `bins` bins within `cap` is balanced enough: balancing by
        tokens, where the mean bin is within half the tolerance of the cap. Then the goal
        `_goal` sets is at or above the cap, and no rank of K bins within the cap holds more
        than K·cap <= (1 + tolerance/2)·K·mean, its share of the step and half the tolerance.
        There first-fit decreasing, cap-safe by construction, is the plan wherever it needs
        no more bins, and the balanced construction, which balances toward a level above the
        cap, is not built: on 17 such steps where FFD needed more bins it was within the cap
        on none. (A largest item near the cap also lifts the goal to it, but no rank bound
        follows: Pareto steps of 2,639 samples on dp16 ended 5.2% apart by rank that way.)"""
        if not np.array_equal(weights, sizes):
            return False
        return (1 + self.tolerance / 2) * int(sizes.sum()) / bins >= cap

    def _goal(self, weights: np.ndarray, bin_of: np.ndarray, bins: int) -> float:
        """Where balancing stops: within half the tolerance of the mean and the heaviest item,
        or, where the packing is above that, of the proven bound on the heaviest bin."""
        slack = 1 + self.tolerance / 2
        goal = slack * max(int(weights.max()), int(weights.sum()) / bins)
        top = int(np.bincount(bin_of, weights=weights, minlength=bins).max())
        if top <= goal:
            return goal
        bound = max_part_lower_bound(weights, bins, upper=top, rel_tol=self.tolerance / 4)
        return max(goal, slack * bound)
