"""Proven lower bounds: on the heaviest part when items fill a given number of parts
(`max_part_lower_bound`; `capped_parts_lower_bound` where each part is bins within a cap), and
on the number of bins of a capacity (`min_bins_lower_bound`, which also counts the bins that
the items over a third of it need as pairs that fit: a largest matching).

For a candidate maximum T, any partition into `parts` parts of load <= T must satisfy:
- every item is at most T, and the total is at most parts × T;
- for every k >= 1 a part holds at most k items over T/(k+1) (k + 1 of them would weigh
  more than T), so there are at most k × parts of them; with k = 1, the items over T/2
  ("big") sit in distinct parts. For equal items this makes the bound exact;
- for every size y, the small items of size >= y fit only into parts whose room left after
  their big item (T, or T - big) is >= y, so their total is at most the sum of those rooms;
  a room below 2y holds one of them at most, so at most the largest small item that fits it
  (`_rooms_fit`, tried after the tests above: 13, 13, 13, 6, 6, 6, 6 in 3 parts at T = 24
  leaves three rooms of 11, which hold one 6 each, 18 of the 24; the optimum is 25).
- Fekete and Schepers' dual feasible functions u_k, k = 2..16 (`_dual_feasible`), and the
  pairs' functions F_s (`_pairs_fit`), tried last too because they rarely bind: they see a spike of
  samples over T/3 whose pairs leave too little room for what is left (truncated reasoning
  steps: u_k +0.6-2% on the bound, F_s up to 2% more, where the LP relaxation proves it).
A T failing any test is below the optimum. Beside them, without T: where n > k × parts items,
some parts hold k + 1 or more (`_crowded_bound`). Feasibility grows with T (a bigger T only adds
room), so the smallest T passing all tests, found by bisection, is a lower bound on the
heaviest part of every partition; after one sort the tests are O(distinct sizes) with numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from slime_hydra.partition.deal import run_starts, sort_values


@dataclass(frozen=True)
class _Items:
    """Items by distinct size, largest first: each size, how many items have it, and the count
    and total of the items of that size or more. Every test below binds at the last item of a
    size, so it runs over the distinct sizes (at most the cap's, for token counts), not the
    items."""

    values: np.ndarray
    counts: np.ndarray
    cum_count: np.ndarray
    cum_total: np.ndarray

    @classmethod
    def of(cls, desc: np.ndarray) -> _Items:
        """From the items sorted largest first."""
        last = np.flatnonzero(np.append(desc[1:] != desc[:-1], True))
        cum_count = last + 1
        counts = np.diff(cum_count, prepend=0)
        return cls(desc[last], counts, cum_count, np.cumsum(desc)[last])


def _passes(items: _Items, parts: int, t: int) -> bool:
    """Whether `parts` parts of load <= t can pass the tests for `items`."""
    values, cum_total = items.values, items.cum_total
    if values[0] > t or cum_total[-1] > parts * t:
        return False
    if not _few_per_part(items, parts, t):
        return False
    rooms = _Rooms.of(items, parts, t)
    if rooms.small.size == 0:
        return True
    fits = rooms.suffix[np.searchsorted(rooms.rooms, rooms.small, side="left")]
    return bool((rooms.demand <= rooms.free + fits).all())


class _Rooms(NamedTuple):
    """At a candidate maximum t: the room beside each size of big item (over t/2, one a part),
    ascending, how many big items have that size (`counts`) and the rooms of that size or more
    in all (`suffix`); what the parts with no big item hold (`free`, t each); the small sizes,
    descending, and the small items' total of each size or more (`demand`)."""

    rooms: np.ndarray
    counts: np.ndarray
    suffix: np.ndarray
    free: int
    small: np.ndarray
    demand: np.ndarray

    @classmethod
    def of(cls, items: _Items, parts: int, t: int) -> _Rooms:
        values, cum_total = items.values, items.cum_total
        b = int(np.searchsorted(-2 * values, -t, side="left"))  # sizes with 2w > t
        rooms = t - values[:b]
        counts = items.counts[:b]
        suffix = np.concatenate((np.cumsum((counts * rooms)[::-1])[::-1], [0]))
        big = int(items.cum_count[b - 1]) if b else 0
        demand = cum_total[b:] - (int(cum_total[b - 1]) if b else 0)
        return cls(rooms, counts, suffix, (parts - big) * t, values[b:], demand)


def _few_per_part(items: _Items, parts: int, t: int) -> bool:
    """Whether, for every k, at most k × parts items (each <= t) are over t/(k+1). The j+1
    largest items are all over t/(k+1) for k = ⌊t / (the j+1-th largest)⌋ (the least such k),
    so checking j + 1 <= that k × parts at the last item of every size checks every k."""
    return bool((items.cum_count <= (t // items.values) * parts).all())


def _crowded_bound(asc_prefix: np.ndarray, parts: int) -> int:
    """A bound on the heaviest part from item counts alone (`asc_prefix`: cumulative sums of
    the items in ascending order, led by 0), 0 when n <= parts. With k = ⌈n / parts⌉ - 1, let S
    be the s >= 1 parts holding k + 1 or more items (so (k+1)·s <= n); the others hold at most
    k each, so S holds at least max(m + k·s, (k+1)·s) items, m = n - k × parts, which weigh at
    least as much as that many smallest items: some part of S weighs ⌈that / s⌉ or more; the
    least over s is the bound. 10, 9, 8, 7, 6 in 2 parts: one holds three items, at least
    6 + 7 + 8 = 21, above the mean of 20 and every test above (and reached: {10, 9}, {8, 7, 6}).
    (Smaller k give bounds too; the largest is the one that counts for few items per part.)
    """
    n = asc_prefix.size - 1
    k = -(-n // parts) - 1
    if k < 1:
        return 0
    m = n - k * parts
    s = np.arange(1, min(parts, n // (k + 1)) + 1)
    held = np.maximum(m + k * s, (k + 1) * s)
    return int((-(-asc_prefix[held] // s)).min())


def max_part_lower_bound(
    weights: Sequence[int], parts: int, upper: int | None = None, rel_tol: float = 0.0
) -> int:
    """The smallest integer T that passes every test above: no partition of `weights` into
    `parts` parts has its heaviest part below it. `upper`, a load known to be reachable (a
    partition's heaviest part), shortens the bisection; with `rel_tol` > 0 it stops once the
    bracket is within that fraction and returns its lower end (still a bound, at most that much
    weaker). 0 for no items."""
    if len(weights) == 0:
        return 0
    if parts < 1:
        raise ValueError(f"max_part_lower_bound needs parts >= 1, got {parts}")
    asc = sort_values(weights)
    items = _Items.of(asc[::-1])
    asc_prefix = np.concatenate(([0], np.cumsum(asc)))
    total = int(asc_prefix[-1])
    lo = max(int(asc[-1]), -(-total // parts), _crowded_bound(asc_prefix, parts))
    # ⌈n / parts⌉ items of the largest size in every part is a partition: all tests pass.
    reachable = -(-asc.size // parts) * int(asc[-1])
    hi = max(lo, reachable if upper is None else int(upper))
    if not _passes(items, parts, hi):  # only if `upper` was not reachable
        hi = max(hi, reachable)

    def plain(t: int) -> bool:
        return _passes(items, parts, t)

    def rooms(t: int) -> bool:
        return plain(t) and _rooms_fit(items, parts, t)

    def dual(t: int) -> bool:
        return rooms(t) and _dual_fit(items, parts, t)

    # The tests that rarely bind, the cheaper first, are tried at the least T the others
    # pass and bisected on only where they fail there.
    lo = _least_passing(plain, lo, hi, rel_tol)
    if lo < hi and not _rooms_fit(items, parts, lo):
        lo = _least_passing(rooms, lo + 1, hi, rel_tol)
    if lo < hi and not _dual_fit(items, parts, lo):
        lo = _least_passing(dual, lo + 1, hi, rel_tol)
    return lo


def _dual_fit(items: _Items, parts: int, t: int) -> bool:
    """Whether `items` (all <= t) pass both families of dual feasible functions."""
    return _dual_feasible(items, parts, t) and _pairs_fit(items, parts, t)


def _rooms_fit(items: _Items, parts: int, t: int) -> bool:
    """The room test of `_passes` where a room below 2y holds at most the largest small item
    that fits it, not all of it (two of y or more would overflow it): for every small size y,
    the small items of y or more weigh at most what the free parts, the rooms of 2y or more
    and, for each room of y to 2y, the largest small item that fits it hold."""
    r = _Rooms.of(items, parts, t)
    if r.small.size == 0 or r.rooms.size == 0:  # no small items, or no rooms: `_passes` decides
        return True
    at = np.searchsorted(-r.small, -r.rooms, side="left")  # each room's largest small item
    one = r.counts * np.where(at < r.small.size, r.small[np.minimum(at, r.small.size - 1)], 0)
    one_prefix = np.concatenate(([0], np.cumsum(one)))
    lo = np.searchsorted(r.rooms, r.small, side="left")  # the first room of at least y
    hi = np.searchsorted(r.rooms, 2 * r.small, side="left")  # and of at least 2y
    held = r.free + r.suffix[hi] + one_prefix[hi] - one_prefix[lo]
    return bool((r.demand <= held).all())


def _least_passing(passes: Callable[[int], bool], lo: int, hi: int, rel_tol: float) -> int:
    """The least T in [lo, hi] that `passes` (monotone, true at hi), by bisection, or the lower
    end of a bracket within `rel_tol` of it."""
    while lo < hi and hi - lo > rel_tol * lo:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


DUAL_ORDERS = np.arange(2, 17)
"""The k of Fekete and Schepers' functions u_k tried (k = 1 is the big-item test above). On 192
cases of 4 fresh seeds of bench_planner's families up to 64 raised no bound that 16 did not,
and 8 missed three steps."""


def _dual_feasible(items: _Items, parts: int, t: int) -> bool:
    """Whether `items` (all <= t) pass Fekete and Schepers' dual feasible functions: with
    x = size / t, u_k(x) = x where (k+1)·x is whole, else ⌊(k+1)·x⌋ / k. In a part of load
    <= t (x-sum <= 1) the items with (k+1)·x whole have an x-sum j / (k+1) for some integer j;
    the others' ⌊(k+1)·x⌋, each below (k+1)·x, add up to less than k + 1 - j, so to at most
    k - j where there are any, and the part's u_k-sum is at most j/(k+1) + (k-j)/k <= 1 (its
    x-sum where there are none): so the items' is at most `parts`. Two items just over t/3 and
    nothing else of t/7 or more fill a part under u_6, which the tests above cannot see."""
    return bool((_dual_sums(items, t) <= parts * DUAL_ORDERS * t).all())


_ORDER = np.repeat(DUAL_ORDERS, DUAL_ORDERS + 1)  # k, once for each j = 1..k+1 of `_STEP`
_STEP = np.concatenate([np.arange(1, k + 2) for k in DUAL_ORDERS])
_FIRST = np.concatenate(([0], np.cumsum(DUAL_ORDERS + 1)[:-1]))  # where each k's j start


def _dual_sums(items: _Items, t: int) -> np.ndarray:
    """For each k of DUAL_ORDERS, the items' u_k-sum (see `_dual_feasible`) scaled by k·t to an
    integer: t·⌊(k+1)·v / t⌋ for each item of size v, less v where (k+1)·v is a multiple of t
    (u_k = x there: k·v in place of (k+1)·v). ⌊(k+1)·v / t⌋ counts the j in 1..k+1 with
    v >= j·t / (k+1), so the items' total of it is, over those thresholds, how many items are
    at or over each: 150 binary searches into the sizes, not a pass over them per k."""
    values = items.values  # descending
    count = np.concatenate(([0], items.cum_count))
    share = _STEP * t
    low = -(-share // (_ORDER + 1))  # the least size at or over the threshold j·t / (k+1)
    over = count[np.searchsorted(-values, -low, side="right")]
    at = over - count[np.searchsorted(-values, -low, side="left")]  # items of size `low`
    exact = share % (_ORDER + 1) == 0
    return np.add.reduceat(over * t - np.where(exact, low * at, 0), _FIRST)


def _pairs_fit(items: _Items, parts: int, t: int) -> bool:
    """Whether `items` (all <= t) pass every pairs' function F_s (`_pair_sums`): each part's
    F_s-sum is at most 2(t - s), so the items' is at most `parts` times that."""
    sums, limits = _pair_sums(items, t)
    return bool((sums <= parts * limits).all())


def _pair_sums(items: _Items, t: int) -> tuple[np.ndarray, np.ndarray]:
    """For each item size s in (t/3, t/2], the items' F_s-sum and what one part of load <= t
    holds of it, 2(t - s). With the items of size >= s "large":
        F_s(x) = 0 for x <= t - 2s;  x for t - 2s < x < s;  t - s for s <= x <= t - s;
                 x + t - 2s for x > t - s.
    A part holds at most two large items (three weigh more than t). With two, both are at most
    t - s and the rest at most t - 2s: 2(t - s). With one, x, the rest (below s, F_s at most
    their size) weigh at most t - x: t - s + t - x, or x + t - 2s + t - x, both at most
    2(t - s). With none, at most t <= 2(t - s). Where a spike of samples lies just over t/3,
    at most `parts` of them go without a partner, and each pair of them leaves room under t - 2s
    that only small samples (F_s = 0) fill: the LP relaxation's duals on such steps weigh the
    spike 1/2 and the small ones 0, as F_s / 2(t - s) does. Over the sizes at once, by binary
    searches into the sizes' running counts and totals."""
    values = items.values  # descending
    s = values[(3 * values > t) & (2 * values <= t)]
    count = np.concatenate(([0], items.cum_count))
    total = np.concatenate(([0], items.cum_total))

    def at_least(a: np.ndarray) -> np.ndarray:  # how many distinct sizes are >= a
        return np.searchsorted(-values, -a, side="right")

    def above(a: np.ndarray) -> np.ndarray:  # how many distinct sizes are > a
        return np.searchsorted(-values, -a, side="left")

    large, top, small = at_least(s), above(t - s), above(t - 2 * s)
    sums = (
        total[small]
        - total[large]
        + (t - s) * (count[large] - count[top])
        + total[top]
        + (t - 2 * s) * count[top]
    )
    return sums, 2 * (t - s)


def min_bins_lower_bound(sizes: Sequence[int] | np.ndarray, cap: int) -> int:
    """Martello and Toth's L2: no packing of `sizes` (each <= cap) into bins of `cap` uses
    fewer bins. 0 for no items.

    For an integer a in [0, cap/2], let J1 = items over cap - a, J2 = items in (cap/2, cap - a]
    and J3 = items in [a, cap/2]. Items of J1 and J2 are over cap/2, so each needs its own bin;
    an item of J1 leaves room under a, so no item of J3 joins it; items of J3 fit only into the
    rooms of the J2 bins, together |J2|·cap - ΣJ2, or into further bins of at most cap each:
        L(a) = |J1| + |J2| + max(0, ⌈(ΣJ3 - (|J2|·cap - ΣJ2)) / cap⌉)
    bins at least, for every a. L(0) is max(⌈Σ/cap⌉, items over cap/2), the plain bound. Between
    two item sizes J3 stays the same while raising a moves items from J2 to J1, which only
    removes room: the maximum is at a = 0 or at a size of an item <= cap/2, so those are the
    only values tried, all at once with sorted prefix sums (O(n log n)). Beside L2: a bin holds
    at most k items over cap/(k+1), so ⌈(items over cap/(k+1)) / k⌉ bins are needed for every
    k (exact for equal items, where L2 is not: seven items of 0.34 × cap need 4 bins, L2 says 3),
    and Fekete and Schepers' dual feasible functions (truncated reasoning steps: 1,481 -> 1,543
    bins on one of 4,161 samples, which first-fit decreasing packs in 1,586), and the pairs'
    functions F_s of `_pair_sums` (8,192 truncated samples with a spike at 0.354 × cap: 2,461
    -> 2,516 bins, where the LP relaxation proves at least 2,509), and the items over cap/3 by a
    largest matching of the pairs that fit (`_matched_bins`).
    """
    w = sort_values(sizes)
    if w.size == 0:
        return 0
    if int(w[-1]) > cap:
        raise ValueError(f"min_bins_lower_bound: an item of size {int(w[-1])} exceeds cap {cap}")
    nsmall = int(np.searchsorted(w, cap // 2, side="right"))  # items <= cap/2
    small, big = w[:nsmall], w[nsmall:]
    # a = 0, then each distinct small size, first at position `first` of `small`.
    first = np.flatnonzero(run_starts(small))
    a = np.concatenate(([0], small[first]))
    first = np.concatenate(([0], first))
    # J3: small items >= a (sorted, so a suffix); J2: big items <= cap - a (a prefix of big).
    small_suffix = np.concatenate((np.cumsum(small[::-1])[::-1], [0]))
    j3 = small_suffix[first]
    n2 = np.searchsorted(big, cap - a, side="right")
    j2 = np.concatenate(([0], np.cumsum(big)))[n2]
    extra = np.maximum(0, -(-(j3 - (n2 * cap - j2)) // cap))
    desc = w[::-1]
    # A bin holds at most k items over cap/(k+1), k = ⌊cap / size⌋ for the j+1 largest items.
    per_bin = -(-np.arange(1, w.size + 1) // (cap // desc))
    # A bin's u_k-sum is at most 1 (`_dual_feasible` at t = cap): as many bins as the items';
    # likewise a bin's F_s-sum is at most 2(cap - s) (`_pair_sums`).
    items = _Items.of(desc)
    dual = -(-_dual_sums(items, cap) // (DUAL_ORDERS * cap))
    sums, limits = _pair_sums(items, cap)
    pairs = -(-sums // limits)
    return int(
        max(
            (big.size + extra).max(),
            per_bin.max(),
            dual.max(initial=0),
            pairs.max(initial=0),
            _matched_bins(w[int(np.searchsorted(3 * w, cap, side="right")) :], cap),
        )
    )


def _matched_bins(large: np.ndarray, cap: int) -> int:
    """The fewest bins of `cap` that the items over cap/3 (`large`, ascending) need: at most two
    share a bin, and two only where they fit together, so their count less a largest matching of
    the pairs that fit. Where k pairs fit, so do k pairs of the 2k smallest items (swap each
    item for a smaller one left out), and 2k items pair up within the cap exactly where the
    i-th smallest fits with the (2k+1-i)-th (uncrossing two pairs keeps both sums within it);
    fewer pairs fit wherever more do, so the largest k is bisected. It sees a truncation spike
    whose rooms take no other sample over cap/3 (16,384 samples, 8,783 over cap/2 and 2,573
    over cap/3 beside them: 8,826 -> 8,833 bins, where the step has 8,832 at its K_lb)."""
    lo, hi = 0, large.size // 2
    while lo < hi:
        k = (lo + hi + 1) // 2
        if int((large[:k] + large[2 * k - 1 : k - 1 : -1]).max()) <= cap:
            lo = k
        else:
            hi = k - 1
    return large.size - lo


def capped_parts_lower_bound(sizes: np.ndarray, parts: int, bins: int, cap: int) -> int:
    """The least T such that `parts` parts of `bins` bins each, every item over `cap` alone in
    a bin and the other bins within it, could hold every item with no part over T (0 where
    the items over the cap outnumber the parts). A part holding the over-cap items S holds at
    most u = bins·cap + Σ_S (w - cap), and no more than T: Σ_p min(T, u_p) >= the total. The u_p
    sum to the same for every placement, and one over-cap item a part is a Robin Hood transfer
    away from any other placement (a part of S1 ∪ S2 and one of none become one of S1 and one
    of S2), so its u are majorized by every placement's and, min(T, ·) being concave, hold the
    most under T: the T they need is a bound. It binds where the cap keeps the parts without
    over-cap items under the mean (bins·cap below it): an oversize step of 5,291 samples on
    dp48, 4 micro-batches a rank, its heaviest rank 1.1719 of the other bounds, 1.0714 of it."""
    over = sizes[sizes > cap]
    if over.size > parts or sizes.size == 0:
        return 0
    room = np.concatenate((bins * cap + over - cap, np.full(parts - over.size, bins * cap)))
    total = int(sizes.sum())
    # Every part at its room (T = the largest) holds the total, where the items pack at all.
    return _least_passing(lambda t: int(np.minimum(t, room).sum()) >= total, 0, int(room.max()), 0)
