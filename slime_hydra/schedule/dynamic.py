"""Dynamic batching: the fewest micro-batches under max_tokens_per_gpu × cp, balanced across DP.

Balance objective (`balance`): `tokens`, or `flops` (a sequence costs a·L + b·L², a and b from
the model dims); the token cap is a hard limit for both.

One algorithm for every step, its work bounded:
1. K starts at its proven lower bound K_lb (one micro-batch per over-cap sample, Martello-Toth's
   L2 and the items-per-bin bound of partition.bounds on the rest, over dp, aligned).
2. The step is packed whole into dp·K micro-batches (over-cap samples alone, under
   oversize=isolate) by the partitioner (partition.balanced.BalancedPacker: an O(n log n)
   construction, then cap repairs and balancing exchanges within its work budget, first-fit
   decreasing where the repairs fall short, and where the exchanges stall above the bound by
   tokens, first-fit decreasing under the balancing goal (MULTIFIT's packing), in the same budget;
   where the heaviest still ends over the tolerance, the step packed again under it by the
   whole-step repair and first-fit decreasing, and where neither packs under it, first-fit
   decreasing under the least limit below the plan's heaviest that MULTIFIT's bisection
   finds).
   Where it cannot fill dp·K micro-batches within the cap, K rises by the VPP alignment: a K
   above K_lb means neither the constructions nor the repairs (of largest fit in rounds and of
   first-fit decreasing's packing cut to dp·K, within the partitioner's
   `repair_budget_per_sample`) packed the step at K_lb, not that no plan exists there. A step
   of 4k samples or more is packed through the heads of groups of similar ones
   (partition.grouping: 2-4k heads, the packing copied), so its search and balancing cost what
   2-4k samples' do, where grouping leaves the step most of its room.
3. The micro-batches are dealt K to each rank (partition.deal.split_even on their weights,
   heaviest first to the lightest rank), then ranks are evened by the same exchanges between
   their micro-batches (partition.ranks.even_groups). Balancing the micro-batches may spend
   MICROBATCH_SHARE of the step's work budget and `budget_per_sample` for each sample, evening
   the ranks the rest of the step's budget. Where K >= 2, a sample heavier than half a rank's
   share first gets a rank of its own, the lightest samples in its other micro-batches (up to
   the share), and the rest is packed at K on the other ranks (partition.ranks.own_ranks; where
   first-fit decreasing packs the rest there): evening could only bring its rank down by moving
   its samples out a few a pass. Where that leaves the heaviest rank over the tolerance, the
   step is also packed whole as above and the lighter kept; where the ranks set apart are over
   it themselves, the step is packed whole first, and kept at once where no rank of it is
   heavier than they are. Balancing by tokens, where the cap keeps the ranks without over-cap
   samples under the mean rank, the over-cap samples get ranks of their own, the other ranks'
   micro-batches filled to the cap and the rest poured beside them
   (partition.ranks.capped_ranks), and the lighter plan is kept.
Every exchange keeps each micro-batch of two or more samples within the cap and non-empty, so
every plan the budget can stop at satisfies the invariants; the budget counts item visits, so
every rank computes the same plan.

Internally a step's samples are numbered 0..n-1; global sample indices come back only in the
returned micro-batches. FLOPs weights are scaled so that the step's costliest sample weighs
2^30 (integers, no overflow, ratios kept).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.balanced import BalancedPacker
from slime_hydra.partition.base import Partitioner, Work
from slime_hydra.partition.bounds import capped_parts_lower_bound
from slime_hydra.partition.deal import split_even
from slime_hydra.partition.greedy import first_fit_decreasing_within
from slime_hydra.partition.multifit import VISITS_PER_ITEM
from slime_hydra.partition.ranks import capped_ranks, even_groups, own_ranks
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.metrics import microbatch_lower_bound
from slime_hydra.schedule.schedule import StepSchedule
from slime_hydra.schedule.steptime import (
    StepCost,
    bin_seconds,
    fastest_order,
    simulate_seconds,
    simulation_visits,
)
from slime_hydra.schedule.strategy import BatchingStrategy, where

FLOPS_SCALE = 1 << 30  # the costliest sample's weight under balance=flops


class Oversize(StrEnum):
    """What to do with a sample longer than the cap on its own."""

    error = "error"
    isolate = "isolate"


class Balance(StrEnum):
    """What micro-batches and ranks are balanced by."""

    tokens = "tokens"
    flops = "flops"


class Count(StrEnum):
    """How many micro-batches each rank gets: the fewest the cap allows, or the count (at or
    above it) whose step the cost model (schedule.steptime) simulates fastest."""

    min = "min"
    fastest = "fastest"


CANDIDATES = 8
"""Counts `fastest` simulates at most (K, K + g, ...); it stops early once two in a row are
slower than the best so far (the step time of more, smaller micro-batches falls while the
pipeline bubble shrinks and rises once their fixed cost dominates)."""


PACKING_PASSES = 3
"""What packing one more count for `fastest` costs beyond VISITS_PER_ITEM visits a sample, in
passes (PASS_OVERHEAD each): the construction, the deal and the ranks' bookkeeping took
0.2-0.8 ms a packing at 256-1,024 samples, and 0.1-0.3 µs a sample beyond that (2026-12-03,
this 2-core machine, grpo, short and truncated families)."""


MICROBATCH_SHARE = 3 / 4
"""Of the step's work budget, what balancing the micro-batches may spend (with the
partitioner's `budget_per_sample` for each sample besides); evening the ranks gets the rest.
On bench_planner's families (4 fresh seeds, 192 cases, default budget) 3/4 against 1/2 left 23
steps more than 1% over the bound instead of 30, at 0-10% more plan time, and the same rank
imbalance (median 1.0003-1.0006, 90th percentile 1.0025-1.0048)."""


class DynamicBatching(BatchingStrategy):
    """Cap-safe, VPP-aligned, DP-balanced micro-batches with one count for all ranks."""

    def __init__(
        self,
        layout: ParallelLayout,
        global_batch_size: int | None,
        max_tokens_per_gpu: int,
        oversize: Oversize | str = Oversize.error,
        partitioner: Partitioner | None = None,
        balance: Balance | str = Balance.tokens,
        flops_coefficients: tuple[float, float] | None = None,
        count: Count | str = Count.min,
        count_margin: float = 0.02,
        step_cost: StepCost | None = None,
    ) -> None:
        if max_tokens_per_gpu is None:
            raise SlimeHydraError(
                "batching=dynamic needs batching.max_tokens_per_gpu (tokens per GPU per "
                "micro-batch); set it, e.g. batching.max_tokens_per_gpu=8192."
            )
        super().__init__(layout, global_batch_size, max_tokens_per_gpu, flops_coefficients)
        self.oversize = Oversize(oversize)
        self.partitioner: Partitioner = partitioner or BalancedPacker()
        self.balance = Balance(balance)
        if self.balance is Balance.flops and flops_coefficients is None:
            raise SlimeHydraError(
                "batching.balance=flops needs the model's FLOPs per sequence (a·L + b·L², from "
                "the model group); build the strategy through the config, or set "
                "batching.balance=tokens."
            )
        self.count = Count(count)
        if not 0 <= count_margin < 1:
            raise SlimeHydraError(
                f"batching.count_margin={count_margin} must lie in [0, 1): the share by which "
                "more micro-batches must simulate faster than the fewest for count=fastest "
                "to take them; the default is 0.02."
            )
        self.count_margin = count_margin
        self.step_cost = step_cost
        self._replayed: set[int] = set()  # counts whose pipeline replay order was paid for
        if self.count is Count.fastest and step_cost is None:
            raise SlimeHydraError(
                "batching.count=fastest needs the step cost model (schedule/steptime.py: "
                "trainer.cost or the analytic model of the trainer's achieved_tflops); build "
                "the strategy through the config, or set batching.count=min."
            )
        if not 0 < self.partitioner.tolerance < 1:
            raise SlimeHydraError(
                f"batching.partitioner.tolerance={self.partitioner.tolerance} must lie in "
                "(0, 1); the default is 0.01."
            )
        for key in ("budget", "budget_per_sample", "repair_budget_per_sample"):
            if getattr(self.partitioner, key) < 0:
                raise SlimeHydraError(
                    f"batching.partitioner.{key}={getattr(self.partitioner, key)} must be >= 0 "
                    "item visits (budget=0 budget_per_sample=0: no balancing beyond the "
                    "construction)."
                )
        if self.partitioner.group_items < 0:
            raise SlimeHydraError(
                f"batching.partitioner.group_items={self.partitioner.group_items} must be >= 0 "
                "samples (0: never pack a step through its groups' heads; the default is "
                "16384)."
            )

    def weights(self, sizes: np.ndarray) -> np.ndarray:
        """What balancing flattens: tokens, or a·L + b·L² FLOPs scaled so that the costliest
        sample weighs FLOPS_SCALE (integers; a ratio of costs is kept to about 1e-9)."""
        if self.balance is Balance.tokens:
            return sizes
        assert self.flops_coefficients is not None
        a, b = self.flops_coefficients
        length = sizes.astype(np.float64)
        cost = a * length + b * length * length
        top = float(cost.max()) if cost.size else 0.0
        if top <= 0:
            return sizes
        return np.maximum(np.rint(cost * (FLOPS_SCALE / top)), 1).astype(np.int64)

    @property
    def isolates_oversize(self) -> bool:
        return self.oversize is Oversize.isolate

    def plan_step(self, lengths: Sequence[int], samples: list[int], step: int) -> StepSchedule:
        cap = self.cap
        assert cap is not None
        sizes = np.fromiter(map(lengths.__getitem__, samples), dtype=np.int64, count=len(samples))
        if self.oversize is Oversize.error and sizes.size and int(sizes.max()) > cap:
            i = samples[int(sizes.argmax())]
            raise SlimeHydraError(
                f"{where(step)}sample {i} has {lengths[i]} tokens, over the cap of "
                f"{cap} tokens per micro-batch (batching.max_tokens_per_gpu="
                f"{self.max_tokens_per_gpu} × parallel.cp={self.layout.cp}); raise "
                "batching.max_tokens_per_gpu, or set batching.oversize=isolate to train "
                "it alone in its own micro-batch."
            )
        weights = self.weights(sizes)
        dp, g = self.layout.dp, self.layout.microbatch_alignment
        k_lb = microbatch_lower_bound(sizes, cap, dp, g)
        found = self._pack(sizes, weights, k_lb, False, self._budget)
        if found is None:
            raise self._too_few(len(samples), k_lb, step)
        k, bin_of = found
        if self.count is Count.fastest:
            k, bin_of = self._fastest(sizes, weights, k, bin_of)
        return StepSchedule.of_bins(step, bin_of, np.asarray(samples, dtype=np.int64), dp, k)

    @property
    def _budget(self) -> tuple[int, int]:
        """The partitioner's balancing work: per step, and per sample besides."""
        return self.partitioner.budget, self.partitioner.budget_per_sample

    def _pack(
        self,
        sizes: np.ndarray,
        weights: np.ndarray,
        k: int,
        exact: bool,
        budget: tuple[int, int],
    ) -> tuple[int, np.ndarray] | None:
        """The micro-batch (rank r's m-th: r·K + m) of each sample at the first count from `k`
        up in steps of the VPP alignment that the partitioner packs (at `k` alone if `exact`),
        with `budget` (per step, per sample) for balancing; None if none. Samples that would
        weigh their ranks down get ranks of their own first (`_pack_around`); where that leaves
        the heaviest rank over the tolerance of its bound, the step is also packed whole, and
        the fewer micro-batches, then the lighter heaviest rank, kept. Where the ranks set apart
        are over the tolerance themselves, the step is packed whole first, and kept at once
        where it has `k` micro-batches a rank and none heavier than they are: no plan around
        them could be lighter."""
        dp = self.layout.dp
        apart = own_ranks(weights, dp, k)
        if apart is None:
            return self._pack_ranks(sizes, weights, dp, k, exact, budget)
        goal = self._rank_goal(weights, k)
        floor = int(np.bincount(apart[1] // k, weights[apart[0]]).max())
        whole = None
        if floor > goal:
            whole = self._pack_ranks(sizes, weights, dp, k, exact, budget)
            if whole is not None and whole[0] == k and self._heaviest(whole, weights) <= floor:
                return whole
        around = self._pack_around(sizes, weights, k, budget, apart, floor)
        if around is not None and self._heaviest(around, weights) <= goal:
            return around
        if whole is None:
            whole = self._pack_ranks(sizes, weights, dp, k, exact, budget)
        if around is None or whole is None:
            return around or whole
        return min(whole, around, key=lambda plan: (plan[0], self._heaviest(plan, weights)))

    def _capped(
        self, sizes: np.ndarray, found: tuple[int, np.ndarray], budget: int
    ) -> tuple[int, np.ndarray]:
        """Where the cap keeps the ranks without over-cap samples under the mean rank (the
        capped bound, partition.bounds.capped_parts_lower_bound, is over the ranks' tolerance of
        the mean) and the plan `found` is over it too: the over-cap samples on ranks of their
        own, the others' micro-batches filled to the cap (partition.ranks.capped_ranks), the
        ranks evened within `budget`; the lighter of the two plans. Packed by micro-batch, an
        over-cap sample's rank holds K - 1 micro-batches as full as the others', which evening
        cannot move into ranks at the cap: 4 of 300 oversize bench cases of 6 seeds were
        1.03-1.12 over their bound, now 1.004-1.016 (docs/planner.md, twenty-sixth round)."""
        k, _ = found
        dp, cap = self.layout.dp, self.cap
        assert cap is not None
        tolerance = self.partitioner.tolerance / 4
        mean = int(sizes.sum()) / dp
        heaviest = self._heaviest(found, sizes)
        if heaviest <= (1 + tolerance) * mean:
            return found
        if capped_parts_lower_bound(sizes, dp, k, cap) <= (1 + tolerance) * mean:
            return found
        capped = capped_ranks(sizes, dp, k, cap)
        if capped is None:
            return found
        even_groups(capped, sizes, sizes, dp, cap, tolerance, Work(budget), sizes > cap)
        return (k, capped) if self._heaviest((k, capped), sizes) < heaviest else found

    def _heaviest(self, plan: tuple[int, np.ndarray], weights: np.ndarray) -> int:
        """The weight of the heaviest rank of a packing (K, micro-batch of each sample)."""
        k, bin_of = plan
        return int(np.bincount(bin_of // k, weights).max())

    def _rank_goal(self, weights: np.ndarray, k: int) -> float:
        """The ranks' tolerance over a lower bound on the heaviest of dp ranks of `k` non-empty
        micro-batches: the mean rank, and the heaviest sample with the k - 1 lightest."""
        lightest = int(np.partition(weights, k - 2)[: k - 1].sum()) if k > 1 else 0
        bound = max(int(weights.sum()) / self.layout.dp, int(weights.max()) + lightest)
        return (1 + self.partitioner.tolerance / 4) * bound

    def _pack_around(
        self,
        sizes: np.ndarray,
        weights: np.ndarray,
        k: int,
        budget: tuple[int, int],
        apart: tuple[np.ndarray, np.ndarray, int],
        floor: int,
    ) -> tuple[int, np.ndarray] | None:
        """The samples `apart` (partition.ranks.own_ranks: those a packing balanced by
        micro-batch would leave their ranks too heavy with) on ranks of their own, the heaviest
        of which weighs `floor`, and the rest packed at `k` on the other ranks, their
        micro-batches not balanced (none may outweigh the heaviest sample set apart, alone in
        its micro-batch: else None) and their ranks evened down to `floor`. Tried only where
        first-fit decreasing packs the rest at `k`: where no two bins of a first-fit packing
        could be at most half full, without computing it. So trying costs no repair. None
        where the rest do not pack."""
        dp, n, cap = self.layout.dp, len(sizes), self.cap
        assert cap is not None
        samples, mb, ranks = apart
        filled = mb % k > 0  # the samples beside the heavy ones
        loads = np.bincount(mb[filled], sizes[samples[filled]])
        if loads.size and int(loads.max()) > cap:
            return None
        rest = np.ones(n, dtype=bool)
        rest[samples] = False
        rest = np.flatnonzero(rest)
        mine = sizes[rest]
        normal = mine[mine <= cap]
        bins = (dp - ranks) * k - (mine.size - normal.size)
        loose = 2 * int(normal.sum()) <= cap * (bins - 1)
        if not (loose or first_fit_decreasing_within(normal, cap, bins)[0] is not None):
            return None
        found = self._pack_ranks(
            mine, mine if weights is sizes else weights[rest], dp - ranks, k, True, budget, floor
        )
        heaviest = int(sizes[samples[~filled]].max())
        if found is None or int(np.bincount(found[1], mine).max()) > heaviest:
            return None
        bin_of = np.empty(n, dtype=np.int64)
        bin_of[rest] = found[1]
        bin_of[samples] = mb + (dp - ranks) * k
        return k, bin_of

    def _pack_ranks(
        self,
        sizes: np.ndarray,
        weights: np.ndarray,
        dp: int,
        k: int,
        exact: bool,
        budget: tuple[int, int],
        floor: int = 0,
    ) -> tuple[int, np.ndarray] | None:
        """`_pack` on `dp` ranks, every sample packed with the others. With a `floor` (the
        heaviest of the ranks `_pack_around` set apart) no rank need weigh less, the
        micro-batches are not balanced (their samples are heavier) and the ranks get the step's
        budget; without, balancing by tokens, a plan over the tolerance where the cap binds is
        weighed against the over-cap samples on ranks of their own (`_capped`)."""
        cap = self.cap
        assert cap is not None
        g = self.layout.microbatch_alignment
        over = sizes > cap
        normal = np.flatnonzero(~over)
        alone = np.flatnonzero(over)
        step_budget, per_sample = budget
        share = int(step_budget * MICROBATCH_SHARE)
        # The ranks get the rest of step_budget.
        work = Work(0 if floor else share + per_sample * normal.size)
        # Bins for the samples within the cap: dp·K less the over-cap ones, K = k, k + g, ...
        start = dp * k - alone.size
        counts = range(start, start + 1) if exact else range(start, normal.size + 1, dp * g)
        if normal.size:
            mine = sizes[normal]  # one array for both where balancing is by tokens
            found = self.partitioner(
                mine, mine if weights is sizes else weights[normal], counts, cap, work
            )
        else:
            found = (0, np.zeros(0, dtype=np.int64)) if dp * k == alone.size else None
        if found is None:
            return None
        bins, packed = found
        k = (bins + alone.size) // dp
        bin_of = np.empty(len(sizes), dtype=np.int64)
        bin_of[normal] = packed
        bin_of[alone] = np.arange(bins, bins + alone.size)
        # Deal the micro-batches K to each rank, heaviest first, then even the ranks.
        bin_w = np.bincount(bin_of, weights=weights, minlength=dp * k).astype(np.int64)
        deal = split_even(bin_w, dp, self.partitioner.tolerance / 4)  # (K, dp) micro-batches
        place = np.empty(dp * k, dtype=np.int64)
        place[deal] = np.arange(dp)[None, :] * k + np.arange(k)[:, None]
        bin_of = place[bin_of]
        ranks = Work(step_budget - min(work.spent, share))
        tolerance = self.partitioner.tolerance / 4
        evened = even_groups(bin_of, sizes, weights, dp, cap, tolerance, ranks, over, floor)
        if evened > 1 + self.partitioner.tolerance:
            # Evened by load, a rank's micro-batches of one sample each (which cannot give it)
            # may meet the lighter ranks' roomiest: where that stalls over the micro-batches'
            # tolerance, the evening goes on with the micro-batches that can give first, in
            # what is left of its budget (it never makes the heaviest rank heavier).
            even_groups(bin_of, sizes, weights, dp, cap, tolerance, ranks, over, floor, True)
        if floor or weights is not sizes:
            return k, bin_of
        return self._capped(sizes, (k, bin_of), step_budget)

    def _fastest(
        self, sizes: np.ndarray, weights: np.ndarray, k: int, bin_of: np.ndarray
    ) -> tuple[int, np.ndarray]:
        """batching.count=fastest: of the counts from the fewest packed (`k`, `bin_of`) up,
        the one whose step simulates fastest, each more tried with the construction alone (no
        balancing budget) and the chosen one packed again with it, each rank's micro-batches
        in the order its pipeline runs fastest; kept only where it simulates faster than the
        fewest so ordered by more than `count_margin` (the model's error between batchings of
        one layout, which a smaller gain does not outrun), so `fastest` never simulates slower
        than `min`. The packings and simulations share a work budget of the partitioner's
        `budget` (a packing PACKING_PASSES passes and VISITS_PER_ITEM visits a sample, a
        simulation steptime.simulation_visits): counts and orders it cannot pay for are not
        tried, so it costs about that budget more than `min`, besides balancing the chosen
        count (a partitioner call) and simulating it against the fewest."""
        assert self.step_cost is not None
        g = self.layout.microbatch_alignment
        work = Work(self.partitioner.budget)
        work.charge(self._simulation_visits(k), passes=0)
        self._replayed.add(k)
        best_s, best_k, slower = self._seconds(sizes, (k, bin_of)), k, 0
        for cand in range(k + g, k + g * CANDIDATES, g):
            visits = VISITS_PER_ITEM * sizes.size + self._simulation_visits(cand)
            if not work.pay(visits, PACKING_PASSES):
                break
            self._replayed.add(cand)
            found = self._pack(sizes, weights, cand, True, (0, 0))  # the construction alone
            if found is None:
                break
            seconds = self._seconds(sizes, found)
            if seconds < best_s:
                best_s, best_k, slower = seconds, cand, 0
            else:
                slower += 1
                if slower == 2:
                    break
        bin_of = self._ordered(sizes, k, bin_of, work)
        if best_k != k:
            found = self._pack(sizes, weights, best_k, True, self._budget)
            assert found is not None  # packed above with less work
            faster = self._ordered(sizes, *found, work)
            fewest = self._seconds(sizes, (k, bin_of))
            if self._seconds(sizes, (best_k, faster)) < (1 - self.count_margin) * fewest:
                k, bin_of = best_k, faster
        return k, bin_of

    def _simulation_visits(self, k: int) -> int:
        """What simulating the DP ranks' pipelines of k micro-batches costs, with finding the
        replay order of k where this strategy has not paid for it yet (`_replayed`: a plan's
        steps are planned in the same order on every rank, so every rank charges alike)."""
        return simulation_visits(self.layout, k, self.layout.dp, k not in self._replayed)

    def _ordered(self, sizes: np.ndarray, k: int, bin_of: np.ndarray, work: Work) -> np.ndarray:
        """`bin_of` with each rank's micro-batches in the order its pipeline runs fastest, of
        the orders `work` pays for."""
        assert self.step_cost is not None
        bin_s = bin_seconds(bin_of, sizes, self.layout.dp * k, self.step_cost)
        return fastest_order(bin_of, bin_s, self.layout, k, self.step_cost, work)

    def _seconds(self, sizes: np.ndarray, found: tuple[int, np.ndarray] | None) -> float:
        """The simulated step time of a packing (`inf` if there is none)."""
        if found is None:
            return np.inf
        assert self.step_cost is not None
        k, bin_of = found
        bin_s = bin_seconds(bin_of, sizes, self.layout.dp * k, self.step_cost)
        return simulate_seconds(
            bin_s.reshape(self.layout.dp, k), self.layout, self.step_cost
        ).step_s

    def _too_few(self, n: int, k: int, step: int) -> SlimeHydraError:
        g = self.layout.microbatch_alignment
        return SlimeHydraError(
            f"{where(step)}{n} samples cannot fill parallel.dp={self.layout.dp} ranks with the "
            f"same number of non-empty micro-batches (a multiple of {g}, at least {k} under "
            f"the cap of {self.cap} tokens); raise batching.global_batch_size, or lower "
            "parallel.dp or parallel.microbatch_group_size_per_vp_stage."
        )
