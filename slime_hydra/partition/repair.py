"""Cap repair of a whole step at once: every bin over the cap searched against every bin with
room, so that a packing full to the cap almost everywhere (first-fit decreasing's, cut to
fewer bins) still finds the few bins that can take its excess.

Each pass gives every item of an over-cap bin its candidate exchanges: the swap with the
smallest item y whose bin takes the shift x - y within its room (a running maximum of y + room
over the light items by size), the swaps whose shift is nearest the bin's excess among the
light items of all bins with room and of the roomiest tenth of them (WINDOW around it), and the
move of the whole item to the bin of least room that holds it. A shift d from a bin of excess e
into one of room r gains min(d, e) - max(d - r, 0) of the total excess over the cap (the
excess may move on, to where a later pass finds room); among equal gains the light bin left
fullest within the cap wins (best fit: the large rooms stay for large excesses). Each pass
takes, of the positive gains, one per heavy bin and one per light bin, the largest first, in
ROUNDS rounds (a heavy bin whose light bin was taken chooses again among the bins left), so
the total excess falls every pass.

Where no exchange lowers the excess (a stall), chains through the bins at the cap are searched
(`_chains`): an over-cap bin swaps an item for one smaller by at least its excess from any bin,
which passes what it is then over by on to a bin with room by a swap of its own (the partners
tried: the items just below the heavy one, and the smallest of all whose bin holds or passes on
the shift, found by one running maximum). Bins at the cap hold most of a near-full step, and a
pass's exchanges, between bins over the cap and bins with room, never reach them: the last few
tokens over (1-30 over a bin or three, after a million visits on 16k samples) then end in a
chain. Chains are searched only where the stall leaves at most the cap over in all: a chain
ends one bin's excess with one item's shift, and a search over 16k samples costs about a pass
(3 searches at 300k tokens over, none of which found a chain, took 88 ms where 61 without; the
same counts on the steps below). On 456 steps of 6 fresh seeds (60 near-full steps and 16 GRPO
and truncated steps at 4k and 16k on dp32 each) the chains left 235 micro-batches above K_lb
where the repair alone left 250, none more on any step; an 800 sample GRPO step on dp1 packs
313, which the count oracle of bench_planner could not. The smallest partner that reaches,
besides those just below, left 231 (4 steps lower).
Where no chain is found either, or the budget left, at the last pass's rate, cannot remove the
excess (passes only slow down as the easy exchanges are made; then only chains that end it are
taken), a kick moves each over-cap bin's smallest item to one of the roomiest bins, and the
passes go on from there: on a step of 4,096 GRPO samples (dp32) a stall 60 tokens over 4 bins,
where no swap fits, was packed after one kick, a count lower. A second stall or slowdown not
below the last kick's excess ends the repair with the packing the kick started from, so a
repair never leaves more excess than it found; one below it ends the repair where it is when
the budget left, at the rate of that kick's cycle (its excess down to this one, for the passes
between), cannot remove the rest: kicks that lower the excess by a fraction of a percent a
cycle cannot end it (a count of 16k truncated samples on dp32 that no start packed: 31 passes,
3,960 -> 3,628 tokens over in five kicks, 36 ms). The work is charged per pass (`pass_visits`),
before it is done: what the budget cannot pay for is not started, and a count that cannot be
packed costs a few passes.

Where a repair stops over the cap, `spill` sheds each bin's excess into new bins: the count the
count search missed often lies between the one it tried and first-fit decreasing's (16k GRPO
samples on dp32: the repairs of 232 micro-batches a rank, 7,424 bins, stopped over the cap;
largest fit's packing, its excess shed into 27 new bins, packs 233, where the search had ended
at first-fit decreasing's 235).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slime_hydra.partition.base import Work
from slime_hydra.partition.deal import ascending, ascending_by, descending, run_starts
from slime_hydra.partition.exchange import Exchanges, apply_exchanges
from slime_hydra.partition.greedy import first_fit_decreasing

WINDOW = (-2, -1, 0, 1)
"""Light items tried around the one whose swap ends the excess exactly."""
TIERS = (0.0, 0.9)
"""The window is searched among the light items of all bins with room, and of the roomiest
tenth (quantile 0.9 of the rooms)."""
COLUMNS = 2 + len(WINDOW) * len(TIERS)
"""Candidates per heavy item: the smallest swap that fits, the windows, the move."""
ROUNDS = 3
"""Choices a pass makes: heavy bins whose best light bin another took choose again among the
bins not yet in an exchange. On 144 bench_planner cases (314 steps) 1 round left 24 steps
above K_lb, 3 left 16 (4: 18, 8: 19), and a repair of 7,674 samples into 2,243 bins took 6
passes instead of 40."""


def pass_visits(heavy_items: int, n: int) -> int:
    """What a pass costs in item visits: each of the n items and bins searched (those not at
    the cap) once, each heavy item's candidates (COLUMNS each, with their binary searches,
    and their scores each round)."""
    return n + heavy_items * (3 + ROUNDS) * COLUMNS


def repair(bin_of: np.ndarray, sizes: np.ndarray, bins: int, cap: int, work: Work) -> bool:
    """Exchange passes on `bin_of` (in place) until every bin of two or more items is within
    `cap` (True), or a kick does not pay (its next stall or slowdown is not below it, or below
    it too little for the budget left at that rate) or `work` cannot pay for the next pass
    (False, with the packing of the last kick's start if the kick left more excess). Bins stay
    non-empty: a move or kick leaves its bin an item."""
    load = np.bincount(bin_of, weights=sizes, minlength=bins).astype(np.int64)
    counts = np.bincount(bin_of, minlength=bins)
    # A bin exactly at the cap neither gives (it is not over) nor takes (no room): only the
    # other bins and their items are searched, for the whole repair. First-fit decreasing's
    # packing cut to a count holds 85% of its bins there.
    live, live_bins = _live(bin_of, load, cap)
    searched = None  # sorted at the first pass paid for: a check with no budget costs no sort
    ranked = None  # every item, smallest first: sorted at the first search for chains
    was, cost = None, 0
    stall: tuple[int, np.ndarray] | None = None  # the excess and packing the last kick left from
    since = 0  # the work spent when it did
    while True:
        over = live_bins[(load[live_bins] > cap) & (counts[live_bins] > 1)]
        excess = int((load[over] - cap).sum())
        if excess == 0:
            return True
        # Where the last kick has not paid, a stop goes back to the packing it left from.
        back = stall[1] if stall is not None and excess >= stall[0] else None
        slow = was is not None and work.outpaced(excess, was - excess, cost)
        visits = pass_visits(int(counts[over].sum()), live.size + live_bins.size)
        if not work.pay(visits):
            break
        was, cost = excess, Work.cost(visits)
        searched = _Searched.of(live, live_bins, bin_of, sizes) if searched is None else searched
        ex = Exchanges.none(0) if slow else _exchanges(searched, load, counts, over, cap)
        chain = ex.give.size == 0 and excess <= cap  # the last tokens over: see the docstring
        if chain and work.pay(pass_visits(int(counts[over].sum()), bin_of.size + bins)):
            ranked = ascending(sizes) if ranked is None else ranked
            ex = _chains(ranked, bin_of, sizes, load, over, cap, whole=slow)
            if ex.give.size:
                apply_exchanges(ex, bin_of, sizes, load, counts)
                live, live_bins = _live(bin_of, load, cap)  # bins at the cap took part
                searched = was = None
                continue
        if ex.give.size == 0:
            if back is not None:
                break
            if stall is not None and work.outpaced(excess, stall[0] - excess, work.spent - since):
                break  # the kicks' cycles lower the excess too slowly to end within the budget
            stall, since = (excess, bin_of.copy()), work.spent
            ex = _kick(searched, load, over, cap)
        apply_exchanges(ex, bin_of, sizes, load, counts)
        searched.moved(ex)
    if back is not None:
        bin_of[:] = back
    return False


def spill(bin_of: np.ndarray, sizes: np.ndarray, bins: int, cap: int) -> int:
    """A packing a repair left over the cap made cap-safe with more bins, in place: each bin
    over the cap sheds its smallest item that ends its excess (where none does, its largest
    items until it is within the cap, never its last), and first-fit decreasing packs what
    they shed into new bins, numbered from `bins`. Returns the bins in all: a count the items
    pack into, where the repair stopped."""
    load = np.bincount(bin_of, weights=sizes, minlength=bins).astype(np.int64)
    over = (load > cap) & (np.bincount(bin_of, minlength=bins) > 1)
    items = np.flatnonzero(over[bin_of])
    if items.size == 0:
        return bins
    items = items[ascending_by(bin_of[items], sizes[items])]  # by bin, smallest first
    size, where = sizes[items].astype(np.int64), bin_of[items]
    first = np.flatnonzero(run_starts(where))
    end = np.append(first[1:], items.size)
    excess = load[where[first]] - cap
    seg = np.repeat(np.arange(first.size), end - first)
    # Each bin's smallest item of at least its excess, by one search over (bin, size) keys.
    keys = seg * (cap + 1) + size
    at = np.searchsorted(keys, np.arange(first.size) * (cap + 1) + excess)
    one = at < end
    shed = np.zeros(items.size, dtype=bool)
    shed[at[one]] = True
    # Elsewhere the largest items, while those larger than each hold less than the excess.
    total = np.cumsum(size)
    shed |= ~one[seg] & (total[end - 1][seg] - total < excess[seg])
    out = items[shed]
    packed = first_fit_decreasing(sizes[out], cap)
    bin_of[out] = bins + packed
    return bins + int(packed.max()) + 1


@dataclass
class _Searched:
    """The items and bins a repair searches (those not at the cap), its items smallest first
    with their sizes and bins beside them, kept current as they move: a pass reads them in
    order, not by gathers across the whole step (27 passes over 1M samples: 1.56 -> 1.09 s,
    the same exchanges)."""

    live_bins: np.ndarray
    by_size: np.ndarray  # the items, smallest first
    size: np.ndarray  # their sizes
    bin: np.ndarray  # their bins
    at: np.ndarray  # each item's place in `by_size` (-1 for those not searched)

    @classmethod
    def of(
        cls, live: np.ndarray, live_bins: np.ndarray, bin_of: np.ndarray, sizes: np.ndarray
    ) -> _Searched:
        by_size = live[ascending(sizes[live])]
        at = np.full(sizes.size, -1, dtype=np.int64)
        at[by_size] = np.arange(by_size.size)
        return cls(live_bins, by_size, sizes[by_size], bin_of[by_size], at)

    def moved(self, ex: Exchanges) -> None:
        """Follow the exchanges `ex` made."""
        swap = ex.take >= 0
        self.bin[self.at[ex.give]] = ex.light
        self.bin[self.at[ex.take[swap]]] = ex.heavy[swap]


def _open_bins(live_bins: np.ndarray, load: np.ndarray, cap: int) -> np.ndarray:
    """The searched bins with room: under the cap (so none of those over it)."""
    return live_bins[load[live_bins] < cap]


def _kick(searched: _Searched, load: np.ndarray, over: np.ndarray, cap: int) -> Exchanges:
    """Where no exchange lowers the excess (or the passes slow past what the budget can
    finish): each bin over the cap gives its smallest item to one of the roomiest bins, the
    largest item to the roomiest, which the next passes repair. The excess rises by what the items
    exceed those rooms, but onto bins of more room and, often, more ways to shed it."""
    is_over = np.zeros(load.size, dtype=bool)
    is_over[over] = True
    heavy_item = np.flatnonzero(is_over[searched.bin])  # places in `by_size`, smallest first
    _, first = np.unique(searched.bin[heavy_item], return_index=True)
    smallest = heavy_item[first]
    smallest = smallest[descending(searched.size[smallest])]
    open_bins = _open_bins(searched.live_bins, load, cap)
    roomiest = open_bins[ascending(load[open_bins])][: smallest.size]
    smallest = smallest[: roomiest.size]
    give = searched.by_size[smallest]
    return Exchanges(searched.bin[smallest], roomiest, give, np.full(give.size, -1), 0)


def _exchanges(
    searched: _Searched,
    load: np.ndarray,
    counts: np.ndarray,
    over: np.ndarray,
    cap: int,
) -> Exchanges:
    """The exchanges of one pass (see the module docstring) from the bins `over`, among the
    `searched` items and bins."""
    is_over = np.zeros(load.size, dtype=bool)
    is_over[over] = True
    open_bins = _open_bins(searched.live_bins, load, cap)
    room = np.zeros(load.size, dtype=np.int64)
    room[open_bins] = cap - load[open_bins]
    open_bins = open_bins[ascending(room[open_bins])]
    rooms = room[open_bins]
    heavy_item = is_over[searched.bin]
    hi, x, heavy = searched.by_size[heavy_item], searched.size[heavy_item], searched.bin[heavy_item]
    light_room = room[searched.bin]
    light_item = light_room > 0
    li = searched.by_size[light_item]  # light items, smallest first
    if li.size == 0:
        return Exchanges.none(0)
    excess = load[heavy] - cap
    li_size, li_room, li_bin = (
        searched.size[light_item],
        light_room[light_item],
        searched.bin[light_item],
    )
    # The smallest y whose bin takes x for y within its room (y + r >= x).
    reach = np.maximum.accumulate(li_size + li_room)
    cands = [np.minimum(np.searchsorted(reach, x), li.size - 1)[:, None]]  # places in `li`
    for q in TIERS:
        least = rooms[int(q * (rooms.size - 1))]
        if least == rooms[0]:  # every light item: no gather
            near = np.searchsorted(li_size, x - excess)[:, None] + np.asarray(WINDOW)
            cands.append(np.clip(near, 0, li.size - 1))
            continue
        tier = np.flatnonzero(li_room >= least)
        near = np.searchsorted(li_size[tier], x - excess)[:, None] + np.asarray(WINDOW)
        cands.append(tier[np.clip(near, 0, tier.size - 1)])
    place = np.concatenate(cands, axis=1)
    # The swaps' columns, then the move's: to the bin of least room that holds the whole item.
    to = np.empty((hi.size, COLUMNS), dtype=np.int64)
    take = np.full((hi.size, COLUMNS), -1, dtype=np.int64)
    d = np.empty((hi.size, COLUMNS), dtype=np.int64)
    to[:, :-1], take[:, :-1] = li_bin[place], li[place]
    np.subtract(x[:, None], li_size[place], out=d[:, :-1])
    to[:, -1] = open_bins[np.minimum(np.searchsorted(rooms, x), open_bins.size - 1)]
    d[:, -1] = x
    to_room = room[to]  # every bin taken to has room: its load is cap - room
    gain = np.minimum(d, excess[:, None]) - np.maximum(d - to_room, 0)
    ok = (d > 0) & ((take >= 0) | (counts[heavy] > 1)[:, None]) & (gain > 0)
    after = cap - to_room + d
    fill = np.where(d <= to_room, after, 0)
    score = np.where(ok, gain * (int(np.abs(after).max()) + 1) + fill, -1)
    # The rows by heavy bin, then item, once a pass: each round takes each bin's best row, of
    # the rows whose heavy bin is in no exchange yet, against light bins in none.
    rows = ascending_by(heavy, hi)
    used = np.zeros(len(load), dtype=bool)  # bins in an exchange chosen this pass
    parts = []
    for _ in range(ROUNDS):
        if parts:
            rows = rows[~used[heavy[rows]]]
            if rows.size == 0:
                break
            free = np.where(used[to[rows]], -1, score[rows])
        else:
            free = score[rows]
        col = free.argmax(axis=1)
        at = np.arange(rows.size)
        best, to_c = free[at, col], to[rows, col]
        # One per heavy bin, then one per light bin, the largest gain first; ties by item.
        first = np.flatnonzero(run_starts(heavy[rows]))
        top = np.repeat(np.maximum.reduceat(best, first), np.diff(np.append(first, rows.size)))
        keep = np.flatnonzero((best == top) & (top > 0))  # places in `rows`
        if keep.size == 0:
            break
        keep = keep[run_starts(heavy[rows[keep]])]
        keep = keep[np.lexsort((hi[rows[keep]], -best[keep], to_c[keep]))]
        keep = keep[run_starts(to_c[keep])]
        chosen = rows[keep]
        used[heavy[chosen]] = used[to_c[keep]] = True
        parts.append((heavy[chosen], to_c[keep], hi[chosen], take[chosen, col[keep]]))
    if not parts:
        return Exchanges.none(0)
    h, t, g, k = (np.concatenate(p) for p in zip(*parts, strict=True))
    return Exchanges(h, t, g, k, 0)


def _live(bin_of: np.ndarray, load: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """The items and the bins a pass searches: those not exactly at the cap."""
    return np.flatnonzero(load[bin_of] != cap), np.flatnonzero(load != cap)


CHAIN_WINDOW = 8
"""Partners each heavy item tries in a chain besides the smallest that reaches: the largest
items at least its bin's excess below it. On the 456 steps of the module docstring 4 left 244
micro-batches above K_lb, 8 and 16 left 235 (16 at 10% more plan time), without that one."""
CHAIN_ROUNDS = 8
"""Choices a search for chains makes: chains that lost a bin to one before them choose again
among the bins left. On the same steps 3 rounds left 238 micro-batches above K_lb, 8 and 32
left 235, as many as choosing chain by chain in order (a Python loop over up to 8 candidates
a heavy item: 445 chains on 16k GRPO samples took ~20 ms)."""


def _chains(
    order: np.ndarray,
    bin_of: np.ndarray,
    sizes: np.ndarray,
    load: np.ndarray,
    over: np.ndarray,
    cap: int,
    whole: bool,
) -> Exchanges:
    """Where no exchange with a bin of room lowers the excess, chains through the bins at the
    cap: a heavy bin (over the cap by e) swaps an item x for a smaller y (x - y >= e, so it
    ends within the cap) of a bin F that has room for x - y, or that passes what it is then
    over by on: one of its other items x' swaps with a smaller y' of a bin L with room for
    x' - y' (`_passable`). The y tried: the CHAIN_WINDOW largest at most x - e, and the
    smallest of all whose bin F takes x for it (y + F's room + what F's best other item
    passes on >= x: the first place where the running maximum of that reaches x). Every bin
    of a chain ends within the cap; one chain per heavy bin, no bin in two, chosen in
    CHAIN_ROUNDS rounds (the largest excess first, each the smallest shift x - y that works; a
    chain that loses a bin to one before it tries again in the next round). With `whole`, only
    chains that end every heavy bin's excess, else none. `order`: every item, smallest first."""
    room = cap - load
    size, bin_ = sizes[order], bin_of[order]
    light = np.flatnonzero(room[bin_] > 0)  # places in `order`, smallest first
    if light.size == 0:
        return Exchanges.none(0)
    passed, partner = _passable(size, bin_, light, room)
    # Each bin's two items that pass on the most: F passes on with the best one that is not y.
    by = ascending_by(bin_, passed)
    last = np.flatnonzero(np.append(run_starts(bin_[by])[1:], True))  # each bin's best
    has, second = bin_[by][last], last - 1
    two = (second >= 0) & (bin_[by][np.maximum(second, 0)] == has)
    best = np.full((2, load.size), -1, dtype=np.int64)  # places in `order`
    best[0, has], best[1, has[two]] = by[last], by[second[two]]
    is_over = np.zeros(load.size, dtype=bool)
    is_over[over] = True
    heavy = np.flatnonzero(is_over[bin_])
    x, h = size[heavy], bin_[heavy]
    excess = load[h] - cap
    y = np.searchsorted(size, x - excess, side="right")[:, None] - 1 - np.arange(CHAIN_WINDOW)
    # What each item's bin passes on once it gives that item: its best other item's pass.
    other = np.where(best[0, bin_] == np.arange(size.size), best[1, bin_], best[0, bin_])
    carry = np.where(other >= 0, passed[np.maximum(other, 0)], 0)
    # And the smallest y of all whose bin takes x for it: x <= y + its room + that carry
    # (bins over the cap take nothing).
    reach = np.maximum.accumulate(
        np.where(is_over[bin_], -1, size + np.maximum(room[bin_], 0) + carry)
    )
    least = np.searchsorted(reach, x)
    found = least < size.size
    least = np.minimum(least, size.size - 1)
    found &= size[least] <= x - excess
    y = np.concatenate((y, np.where(found, least, -1)[:, None]), axis=1)
    ok = y >= 0
    y = np.maximum(y, 0)
    f = bin_[y]
    shift = x[:, None] - size[y]
    need = shift - room[f]  # what F is over by once it takes x for y
    on = other[y]
    ok &= ~is_over[f] & (f != h[:, None]) & ((need <= 0) | (carry[y] >= need))
    rows, cols = np.nonzero(ok)
    if whole and np.count_nonzero(np.bincount(h[rows], minlength=load.size)[over]) < over.size:
        return Exchanges.none(0)  # some heavy bin has no chain
    tried = np.lexsort((shift[rows, cols], -excess[rows]))
    rows, cols = rows[tried], cols[tried]
    hb, fb, on = h[rows], f[rows, cols], on[rows, cols]
    lb = np.where(need[rows, cols] > 0, bin_[partner[on]], -1)  # -1: F takes the shift
    used = np.zeros(load.size + 1, dtype=bool)  # used[-1]: never, for chains without an L
    chosen = []
    for _ in range(CHAIN_ROUNDS):
        free = np.flatnonzero(~used[hb] & ~used[fb] & ~used[lb])
        if free.size == 0:
            break
        by_bin = ascending(hb[free])  # each heavy bin's candidates, first first
        starts = run_starts(hb[free][by_bin])
        free = free[np.sort(by_bin[starts])]  # each heavy bin's first, in order
        # A bin serves the first chain that claims it (as F or L); a chain that loses one drops.
        claims = np.concatenate((fb[free], lb[free]))
        owner = np.tile(np.arange(free.size), 2)
        claimed = claims >= 0
        claims, owner = claims[claimed], owner[claimed]
        by_claim = np.lexsort((owner, claims))
        won = np.ones(free.size, dtype=bool)
        won[owner[by_claim][~run_starts(claims[by_claim])]] = False
        keep = free[won]
        used[hb[keep]] = used[fb[keep]] = True
        used[lb[keep][lb[keep] >= 0]] = True
        chosen.append(keep)
    if not chosen:
        return Exchanges.none(0)
    keep = np.concatenate(chosen)
    if whole and keep.size < over.size:
        return Exchanges.none(0)
    passes = keep[lb[keep] >= 0]
    return Exchanges(
        np.concatenate((hb[keep], fb[passes])),
        np.concatenate((fb[keep], lb[passes])),
        np.concatenate((order[heavy[rows[keep]]], order[on[passes]])),
        np.concatenate((order[y[rows[keep], cols[keep]]], order[partner[on[passes]]])),
        0,
    )


def _passable(
    size: np.ndarray, bin_: np.ndarray, light: np.ndarray, room: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each item (`size` ascending, in bins `bin_`), the most it can pass on to a bin
    with room by one swap, 0 if nothing: itself less the smallest item y' of another bin
    (among `light`, places in bins with room) that takes it for y' (y' + room >= it), and that
    y' (a place in `size`). A running maximum of y' + room over the light items finds y'."""
    reach = np.maximum.accumulate(size[light] + room[bin_[light]])
    at = np.minimum(np.searchsorted(reach, size), light.size - 1)
    partner = light[at]
    passed = size - size[partner]
    fits = (reach[at] >= size) & (passed > 0) & (bin_[partner] != bin_)
    return np.where(fits, passed, 0), partner
