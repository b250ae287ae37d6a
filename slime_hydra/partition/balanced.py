"""The default partitioner of dynamic batching: the fewest non-empty bins under a cap, of the
counts allowed, as even as a work budget allows (`BalancedPacker`).

It builds its starts with partition.construct (and first-fit decreasing where the step is
full), searches the counts below first-fit decreasing's with the repairs of partition.improve
and partition.repair, and balances the packing it found within the budget.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from slime_hydra.partition.base import Work
from slime_hydra.partition.bounds import max_part_lower_bound
from slime_hydra.partition.construct import construct, cut_to, fit_rounds
from slime_hydra.partition.greedy import first_fit_decreasing
from slime_hydra.partition.grouping import Grouping
from slime_hydra.partition.improve import improve
from slime_hydra.partition.multifit import VISITS_PER_ITEM, ffd_within, fill_empty, multifit
from slime_hydra.partition.repair import repair, spill

NEAR_PASSES = 4
"""What the refit gives the plan as it is (`partition.repair`) before it packs the step again,
in passes of one visit a sample (NEAR_PASSES × (n + PASS_OVERHEAD) visits): where balancing
stopped just over the tolerance a few exchanges end it (a truncated step of 4,096 samples on
dp32 at 1.0109 of its bound: 0.6 ms, where largest fit's refit took 8 ms), and where it stopped
far over they fail fast. A pass over many heavy items costs more than that, so there the plan
gets none; sized by the heavy items' pass cost instead, steps over 1.01 of their bound rose
from 4 to 12 of 456 (docs/planner.md, twenty-first round): the near repair rarely packs there
and spends what largest fit's refit needs."""


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
    """More work for balancing the micro-batches, per sample of the step: two first-fit
    decreasing packings' worth (VISITS_PER_ITEM a sample each), which a fixed budget stops
    paying for from 7,500 samples a step, where the exchanges alone stall 2-4% above the
    bound."""
    repair_budget_per_sample: int = 10 * VISITS_PER_ITEM
    """Work for the whole-step repairs, per sample of the step besides its `budget`, once for
    the count search's cap repairs, spent only where the constructions break the cap at the
    first count, and once for the refit of a balancing that ends over the tolerance. One
    micro-batch fewer per rank saves more step time than this costs (at most ~5 µs a sample).
    On 144 bench_planner cases (314 steps) 20 a sample left 29 steps above K_lb, 50 left 21,
    100 left 17 and 200 left 16 (docs/planner.md, eleventh round)."""

    group_items: int = 2_048
    """Steps of at least twice this many samples are packed through the heads of groups of
    similar samples, at least this many (partition.grouping), where that loses too little room
    to risk a count or the tolerance; 0: never. At 1M samples on dp4096 the count search of
    the whole step took 2.8 s where it could not pack, that of the heads a few ms; near-full
    steps of 16k samples on dp32 and dp64 took half the time from heads of 2,048 as whole
    (16,384, the default before), with 46 micro-batches above K_lb on 280 of them against 49
    (docs/planner.md, eighteenth and thirtieth rounds)."""

    def __call__(
        self,
        sizes: np.ndarray,
        weights: np.ndarray,
        counts: Sequence[int],
        cap: int,
        work: Work,
    ) -> tuple[int, np.ndarray] | None:
        """The first bin count of `counts` (ascending) these items fill, non-empty and within the
        cap (every size <= cap), as far as the constructions below find, and the bin of each item;
        None if none. The first count gets the balanced construction, or where it breaks the cap
        largest fit in rounds (on a full step, `_full`, largest fit, then first-fit decreasing's
        packing where it needs no more bins). Where both fail, first-fit decreasing's own count is
        packable (it packs every count from its own up) and the counts below it are bisected with
        the constructions and the repairs (of the fewest-bins packing found so far, FFD's at first,
        cut to the count, whose bins are full, the whole-step repair of partition.repair, first
        within the step's `budget`; of largest fit: paired exchanges, then the whole-step repair;
        the cut's repair resumed), so a step tries O(log) counts, not every one up to it; a count
        whose repairs stop over the cap is not wasted: the better of its two starts, its bins'
        excess shed into new bins (partition.repair.spill), packs a count that lowers the top of the
        bisection where it is below it. The repairs share one budget of their own (`_repairs`), so a
        count that cannot be packed leaves the balancing its budget, and the search costs at most
        that in exchanges besides its constructions and the first cut repairs; at FFD's own count
        the balanced construction repaired (within the step's `budget`) and largest fit still go
        first: FFD fills its bins to the cap and leaves its last ones nearly empty. The plan found
        is then balanced within `work`: exchanges with half of it; where they stop above the goal,
        by tokens, first-fit decreasing under the goal (partition.multifit) where it packs;
        exchanges again; where the heaviest bin still ends over the tolerance, the refit
        (`_refit`) with a repairs' budget of its own (where `work` has any budget: a call with
        none, count=fastest's constructions of its candidate counts, balances nothing). A step of
        at least 2 × `group_items` items is packed so through its groups' heads
        (partition.grouping) and the heads' packing copied, where that loses too little room."""
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

        ffd = None
        if full(0):  # largest fit in rounds, else FFD: no construction (see `_full`)
            bin_of = packed(fitted(0), 0, Work(0))
            if bin_of is None:
                ffd = first_fit_decreasing(sizes, cap)
                bin_of = ffd_at(0) if int(ffd.max()) < counts[0] else None
        else:
            bin_of = packed(built(0), 0, Work(0))
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
                    # Once a count below FFD's is packed, its packing is the one cut: fewer
                    # bins to shed (of 2,400 GRPO and truncated steps of 100-1,000 samples on
                    # one rank, 21 packed fewer bins so, 1 more).
                    cut = cut_to(ffd if bin_of is None else bin_of, sizes, counts[mid])
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
        with work.part(work.remaining // 2) as half:
            improve(bin_of, sizes, weights, bins, cap, goal, half)
        top = int(np.bincount(bin_of, weights=weights, minlength=bins).max())
        if top > goal:
            tokens = np.array_equal(weights, sizes)  # balanced by tokens: loads are the sizes
            if tokens:
                # One limit, the goal (MULTIFIT's bisection found packings the refit below
                # redid). Not before the exchanges: FFD fills its bins to the goal, the ceiling
                # rank evening may not raise a micro-batch above, and ranks the exchanges would
                # have balanced ended up to 0.6% apart (docs/planner.md, twenty-eighth round).
                refit = ffd_within(sizes, bins, int(goal), work)
                bin_of = bin_of if refit is None else refit
            improve(bin_of, sizes, weights, bins, cap, goal, work)
            if tokens and work.budget:  # none where the call asks for no balancing at all
                refits = self._repairs(len(sizes), packings=1)
                bin_of = self._refit(sizes, bin_of, bins, refits)
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
        `work`: the heads' count search and balancing are the step's, to the tolerance of
        `Grouping.tolerance` (the copies' heaviest bin is the heads')."""
        head_sizes = groups.heads(sizes)
        head_weights = head_sizes if weights is sizes else groups.heads(weights)
        head_counts = groups.counts(counts)
        tolerance = groups.tolerance(weights, head_weights, counts[0], self.tolerance)
        found = replace(self, tolerance=tolerance)(head_sizes, head_weights, head_counts, cap, work)
        if found is None:
            return None
        head_bins, head_bin = found
        bins = counts[bisect_left(head_counts, head_bins)]
        return bins, groups.spread(head_bin, head_bins, bins, weights)

    def _refit(self, sizes: np.ndarray, bin_of: np.ndarray, bins: int, work: Work) -> np.ndarray:
        """Where the heaviest bin is still over the tolerance of the proven bound, T = (1 +
        tolerance) × bound: the packing repaired to T as its cap (partition.repair, within
        `work`), first as it is for NEAR_PASSES passes, then from largest fit in rounds under
        T; where neither packs, first-fit decreasing under T where it needs no more bins, else
        FFD's packing under T cut to the count and repaired; else, with what the repairs left,
        FFD under the least limit below the plan's top that MULTIFIT's bisection finds; else
        `bin_of`, unchanged. `work` pays for FFD under T beside the repairs, which leave it
        (`_repairs` with one packing): of 1,200 truncated steps of 400-800 samples on dp8-16
        under 4,096 (one or two a micro-batch), 71 ended over 1.01 of their bound, 9 of them
        because largest fit's repair had left FFD, which packs under T, less than its price;
        with it paid for, 62, of which the bisection lowered 3 (1.0387 -> 1.0169), none higher
        (docs/planner.md, thirty-first round). FFD
        under T packed steps of one or two samples a micro-batch whose pairs the repairs could
        not find (648 truncated samples in 480 micro-batches: 1.0268 -> 1.0099), and its cut,
        a few bins' worth over T, GRPO steps of three where largest fit's repair failed (4,096
        in 1,344: 1.0181 -> 1.0099). They go last: FFD fills its bins to T, the ceiling rank
        evening may not raise a micro-batch above, and where largest fit packs too the ranks
        ended up to 0.3% further apart (docs/planner.md, twenty-eighth round).
        Exchanges of one item at a time stall in local optima where bins hold few items, and
        first-fit decreasing under T needs more bins; the repair searches every bin with room.
        On 47 steps of the bench's random cases ending 1.0102-1.056 over their bound
        (truncated and around-cap/3 steps of 3-5 samples a micro-batch), it packed 41 within
        the repairs' budget; the goal's half tolerance as T packed 24 (docs/planner.md). It has
        a budget of its own: after a count search that could not pack K_lb had spent its
        repairs' budget, a truncated step of 4,743 samples on dp3 stayed 1.97% over. The bound
        is exact, the one `batch/mb_tokens_lb` reports: from a bisection stopped within a
        quarter of the tolerance (up to 0.25% lower) T was a cap the repair could miss where
        the tolerance itself packs (a truncated step of 1,230 samples on dp24 stayed 2.43%
        over, now 1.00%)."""
        top = int(np.bincount(bin_of, weights=sizes, minlength=bins).max())
        bound = max_part_lower_bound(sizes, bins, upper=top)
        limit = int((1 + self.tolerance) * bound)
        if top <= limit:
            return bin_of
        # limit < top <= cap: a packing within the limit is within the cap. The repairs leave
        # what FFD under T costs (`work.pay` below): it is always paid for.
        ffd_visits = VISITS_PER_ITEM * len(sizes)
        reserve = Work.cost(ffd_visits)
        near = bin_of.copy()
        near_passes = Work.cost(NEAR_PASSES * len(sizes), NEAR_PASSES)
        with work.part(min(near_passes, work.remaining - reserve)) as first:
            if repair(near, sizes, bins, limit, first):
                return near
        refit = fit_rounds(sizes, bins, limit)
        with work.part(work.remaining - reserve) as fit:
            if repair(refit, sizes, bins, limit, fit):
                return refit
        # One FFD under T, the plan where it needs no more bins, else the start cut to them and
        # repaired; else, with what is left, the least limit below top at which FFD packs, as
        # MULTIFIT bisects it.
        if not work.pay(ffd_visits):
            return bin_of
        ffd = first_fit_decreasing(sizes, limit)
        if int(ffd.max()) < bins:
            fill_empty(ffd, sizes, bins)
            return ffd
        refit = cut_to(ffd, sizes, bins)
        if repair(refit, sizes, bins, limit, work):
            return refit
        lower = multifit(sizes, bins, limit, top, work)
        return bin_of if lower is None else lower

    def _repairs(self, n: int, packings: int = 0) -> Work:
        """The whole-step repairs' budget for `n` items: the step's `budget` and
        `repair_budget_per_sample` for each item, and the price of `packings` first-fit
        decreasing packings beside them (the refit's, under T, which its repairs leave)."""
        packing = Work.cost(VISITS_PER_ITEM * n)
        return Work(self.budget + self.repair_budget_per_sample * n + packings * packing)

    def _full(self, sizes: np.ndarray, weights: np.ndarray, bins: int, cap: int) -> bool:
        """Whether every packing of `bins` bins within `cap` is balanced enough: balancing by
        tokens, where the mean bin is within half the tolerance of the cap. Then the goal `_goal`
        sets is at or above the cap, and no rank of K bins within the cap holds more than K·cap <=
        (1 + tolerance/2)·K·mean, its share of the step and half the tolerance. There largest fit in
        rounds is the plan where it is within the cap, else first-fit decreasing, cap-safe by
        construction, wherever it needs no more bins (computed only then: 2-6 ms at 16k samples;
        largest fit, 0.5 ms, packed 2 of 456 near-full lab steps where FFD did too, each at a lower
        top and a third of the time), and the balanced construction, which balances toward a level
        above the cap, is not built: on 17 such steps where FFD needed more bins it was within the
        cap on none. (A largest item near the cap also lifts the goal to it, but no rank bound
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
