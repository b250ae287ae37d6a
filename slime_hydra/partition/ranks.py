"""DP ranks' shares of a step: the heavy items set apart on ranks of their own (`own_ranks`),
the over-cap items on theirs where the cap keeps the other ranks under their share
(`capped_ranks`), and groups of bins (a rank's micro-batches) evened in place by bulk moves of
light items and single exchanges between the heaviest groups and the lightest, within a work
budget (`even_groups`)."""

from __future__ import annotations

import numpy as np

from slime_hydra.partition.base import Work
from slime_hydra.partition.bounds import max_part_lower_bound
from slime_hydra.partition.construct import largest_fit, pour
from slime_hydra.partition.deal import ascending, descending, run_starts
from slime_hydra.partition.exchange import Exchanges, bulk_moves, bulk_visits, visits
from slime_hydra.partition.improve import Packing, hopeless


def even_groups(
    bin_of: np.ndarray,
    sizes: np.ndarray,
    weights: np.ndarray,
    groups: int,
    cap: int,
    tolerance: float,
    work: Work,
    fixed: np.ndarray | None = None,
    floor: float = 0,
    givers_first: bool = False,
) -> float:
    """Even the weight of groups of bins (group r: bins r·k .. r·k + k - 1), in place, until the
    heaviest group is within `tolerance` of the mean (or of `floor`, the heaviest of groups
    evened apart, where that is higher), no exchange helps or `work` is spent; returns the
    heaviest group over that floor (the mean, or a proven bound where it is higher).

    Each pass pairs the heaviest groups with the lightest, and within a pair the heavier
    group's open bins, heaviest first, with the lighter group's, lightest first (a locked bin,
    an over-cap sample alone, pairs with none: by load it took the roomiest partner, and
    oversize steps' ranks stalled 1.045-1.054 over their bound). With `givers_first`, the
    heavier group's bins of one item, which cannot give, go after the others: by load alone
    a rank's micro-batches of one large sample each take the lighter rank's roomiest, and its
    micro-batches of small samples meet full ones (an over_half step of 768 samples on dp48,
    K = 8, stopped 1.0603 over the mean rank; givers first, 1.0024). Every bin pair moves its
    lightest items up to an equal share, among the pair of groups' open bin pairs (with
    `givers_first`, those whose heavier bin can give), of half the groups' gap: 1/(2k) of it
    where no bin is locked. (With k shares always, a rank whose other micro-batches hold
    over-cap samples alone shed 1/(2k) of its gap a pass: an oversize step of 4,011 samples on
    dp48, K = 3, took 14 passes where it takes 5.) Where none can move, the pair of groups
    makes the one exchange, of all its bin pairs, that brings them nearest (a shift in (0,
    gap)). So the heavier group gets lighter and no bin heavier than the heaviest was.
    It stops where the work left cannot bring the groups above the goal at the start down to
    it at the rate of all its passes so far (`hopeless`; a pass's own rate swings between bulk
    moves and exchanges): a step whose isolated over-cap samples leave the other ranks'
    micro-batches at the cap spent its whole budget for 0.4%.
    """
    bins = int(bin_of.max()) + 1 if bin_of.size else 0
    k = bins // groups
    if groups < 2 or k == 0:
        return 1.0
    movable = np.ones(len(bin_of), dtype=bool) if fixed is None else ~fixed
    locked = np.zeros(bins, dtype=bool)
    if fixed is not None:
        locked[bin_of[fixed]] = True
    state = Packing.of(bin_of, sizes, weights, bins)
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
        floor,
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
    everyone = np.ones(bins, dtype=bool)  # who gives first by load: every bin
    while work.left:
        group_load = load.reshape(groups, k).sum(1)
        if group_load.max() <= goal:
            break
        over = group_load * groups > (1 + tolerance) * int(group_load.sum())
        heavy = np.flatnonzero(over)
        pool = np.flatnonzero(~over)
        heavy = heavy[descending(group_load[heavy])]
        pool = pool[ascending(group_load[pool])]
        m = min(heavy.size, pool.size)
        heavy = heavy[:m]
        light = pool[(np.arange(m) + rotation) % pool.size]
        # Locked bins last on both sides: open bins pair with open bins; with `givers_first`,
        # the heavier side's bins of one item (no bin goes empty) before them.
        shut = np.iinfo(np.int64).max
        gives = state.counts > 1 if givers_first else everyone
        mine = np.where(locked, -shut, load - np.where(gives, 0, ceiling + 1)).reshape(groups, k)
        h_bins = heavy[:, None] * k + np.argsort(-mine[heavy], axis=1, kind="stable")
        mine = np.where(locked, shut, load).reshape(groups, k)
        l_bins = light[:, None] * k + np.argsort(mine[light], axis=1, kind="stable")
        gap = np.repeat(group_load[heavy] - group_load[light], k)
        h_bins, l_bins = h_bins.ravel(), l_bins.ravel()
        open_ = ~locked[h_bins] & ~locked[l_bins]
        h_bins, l_bins, gap = h_bins[open_], l_bins[open_], gap[open_]
        # Each pair of groups' open bin pairs (that can give, with `givers_first`) share half
        # its gap.
        pair_of = np.flatnonzero(open_) // k
        shares = np.bincount(pair_of, weights=gives[h_bins], minlength=m)[pair_of]
        shares = np.maximum(shares.astype(np.int64), 1)
        # Only the bin pairs the budget pays for (bulk moves, then exchanges), heaviest first.
        held = np.cumsum(state.counts[h_bins])
        paid = work.paid(
            bulk_visits(held, n) + visits(held, np.cumsum(state.counts[l_bins]), n), passes=2
        )
        if paid == 0:
            break
        h_bins, l_bins, gap, shares = h_bins[:paid], l_bins[:paid], gap[:paid], shares[:paid]
        room = ceiling - load[l_bins]
        ex = bulk_moves(  # each bin pair at most its share of half the gap
            state.bin_of,
            weights,
            sizes,
            h_bins,
            l_bins,
            np.minimum(gap // (2 * shares), room),
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
            if hopeless(was_above, goal, excess, work, work.spent - spent):
                break
        if not bool((ex.heavy // k == top).any()):  # the heaviest tries the next partner
            rotation += 1
            if rotation >= pool.size:
                break
    return float(load.reshape(groups, k).sum(1).max()) / floor


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


def own_ranks(weights: np.ndarray, dp: int, k: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """The items that bins balanced among themselves and dealt k to each of `dp` groups would
    leave their groups too heavy with, each on a group of its own: (the items set apart, the
    bin of each, group r's m-th bin r·k + m, and the number R of groups they take), the rest to
    fill the other dp - R groups' k bins each; None where there are none or too few others.
    - Each item heavier than the share of the groups left (once the heavier ones are set apart
      with theirs) alone in its group's first bin, the lightest items one to each of its other
      bins: no group holding it can weigh less.
    - Then each item heavier than half the share of the groups left alone in its group's first
      bin, the lightest items left in its other ones up to the share (at least one each), where
      the running sum of the shares falls nearest, so the groups left keep theirs. Dealt bins of
      the mean, its group would be over by more than half its other bins' weight, which evening
      moves out a few items a pass: a Pareto step of 3,000 samples on dp64 (K = 7) with samples
      at the cap, 1.35 ranks' shares, stopped 1.39 over the mean rank, the floor 1.36; one with
      a sample of 0.98 shares, 1.13 over.
    Not where such items outnumber the groups (no group is left for the rest), nor with k < 2
    (a group of one bin is that bin)."""
    n = len(weights)
    total = int(weights.sum())
    if n == 0 or k < 2 or int(weights.max()) * 2 * dp <= total:
        return None
    asc = ascending(weights)
    w = weights[asc]
    light = np.concatenate(([0], np.cumsum(w)))  # of the lightest i: light[i]
    top = w[::-1][: dp - 1]
    j = np.arange(top.size)
    # With the j heaviest and j·(k - 1) lightest set aside, is the next heaviest still over the
    # share of the dp - j groups left?
    left = total - (np.cumsum(top) - top) - light[np.minimum(j * (k - 1), n)]
    heavier = top * (dp - j) > left
    g = top.size if heavier.all() else int(np.argmin(heavier))
    share = float(left[g]) / (dp - g) if g < top.size else 0.0
    h = int(np.count_nonzero(w * 2 > share)) - g
    h = h if g + h < dp else 0
    if g + h == 0:
        return None
    ends, target = [0], 0.0  # the lightest items each set-apart group takes: asc[ends[r]:ends[r+1]]
    for i in range(g + h):
        if i < g:
            ends.append(ends[-1] + k - 1)
            target = float(light[min(ends[-1], n)])
            continue
        target += share - float(w[n - 1 - i])
        at = min(int(np.searchsorted(light, target)), n)
        at -= at > 0 and target - light[at - 1] < light[at] - target
        ends.append(max(ends[-1] + k - 1, at))
    if n - ends[-1] - (g + h) < (dp - g - h) * k:  # the rest cannot fill the other groups
        return None
    group = np.repeat(np.arange(g + h), np.diff(ends))
    within = np.arange(ends[-1]) - np.repeat(ends[:-1], np.diff(ends))
    items = np.concatenate((asc[::-1][: g + h], asc[: ends[-1]]))
    bins = np.concatenate((np.arange(g + h) * k, group * k + 1 + within % (k - 1)))
    return items, bins, g + h


def capped_ranks(sizes: np.ndarray, groups: int, k: int, cap: int) -> np.ndarray | None:
    """Where the cap keeps the groups without an over-cap item under the mean group (their k
    bins hold at most k·cap), the bin of each item (group r's m-th bin r·k + m): each over-cap
    item alone in the first bin of a group of its own; the other groups' bins filled to the cap
    by largest fit in rounds (the largest items that fit first, the small ones filling what is
    left); and the items left poured (construct.pour) into the bins beside the over-cap items,
    each toward its part of what its group takes where those groups end at one level (each at
    most its item and k - 1 bins of the cap less the largest item left), so the group of the
    largest item takes the least. A packing balanced by bin gives an over-cap item's group k - 1
    bins as full as the others', and evening cannot move items into groups at the cap. None
    where the over-cap items are none or not fewer than the groups, k < 2, fewer items are left
    than bins beside them, or one of those would break the cap."""
    over = np.flatnonzero(sizes > cap)
    r = over.size
    if r == 0 or r >= groups or k < 2:
        return None
    normal = np.flatnonzero(sizes <= cap)
    order = normal[ascending(sizes[normal])]
    placed = largest_fit(sizes[order], np.full((groups - r) * k, cap, dtype=np.int64))
    left = order[placed < 0][::-1]  # heaviest first
    if left.size < r * (k - 1):
        return None
    bin_of = np.empty(sizes.size, dtype=np.int64)
    over = over[descending(sizes[over])]
    bin_of[over] = np.arange(r) * k
    fits = placed >= 0
    bin_of[order[fits]] = r * k + placed[fits]
    # The groups' loads where the left items fill them to one level, each group at most its
    # item and k - 1 bins of `room`; each bin beside an item starts at the cap less its part of
    # what its group takes, so pouring to one level fills each to within half an item of it.
    heavy = sizes[over].astype(np.float64)
    room = cap - int(sizes[left[0]])  # pouring ends within half an item of the level
    take = _water(heavy + (k - 1) * room, float(heavy.sum() + sizes[left].sum())) - heavy
    load = np.repeat(np.rint(cap - take / (k - 1)).astype(np.int64), k - 1)
    beside = (np.arange(r)[:, None] * k + np.arange(1, k)[None, :]).ravel()
    where = np.empty(left.size, dtype=np.int64)
    pour(np.arange(left.size), sizes[left], where, load)
    bin_of[left] = beside[where]
    real = np.bincount(where, sizes[left], minlength=beside.size)
    if int(real.max()) > cap or int(np.bincount(where, minlength=beside.size).min()) == 0:
        return None
    return bin_of


def _water(capacities: np.ndarray, total: float) -> np.ndarray:
    """What each of parts of these `capacities` holds where `total` fills them to one level,
    none over its capacity: min(level, capacity), summing to `total` where they can hold it
    (each at its capacity where they cannot)."""
    asc = np.sort(capacities)
    # With the j smallest parts at their capacity, the others share what is left evenly.
    full = np.concatenate(([0.0], np.cumsum(asc)[:-1]))
    levels = (total - full) / np.arange(asc.size, 0, -1)
    fits = np.flatnonzero(levels <= asc)
    return np.minimum(capacities, levels[fits[0]] if fits.size else np.inf)
