"""partition.repair: the whole-step cap repair, by hand, as properties, and where the planner's
count search needs it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_hydra.partition import BalancedPacker, Work, balanced
from slime_hydra.partition import repair as repair_module
from slime_hydra.partition.base import PASS_OVERHEAD
from slime_hydra.partition.construct import cut_to, fit_rounds
from slime_hydra.partition.deal import ascending
from slime_hydra.partition.exchange import Exchanges, apply_exchanges
from slime_hydra.partition.repair import _chains, pass_visits, repair, spill
from slime_hydra.schedule import DynamicBatching, ParallelLayout, step_metrics
from slime_hydra.schedule.metrics import microbatch_lower_bound
from tests.families import lengths_of

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("at_cap", [[], [7, 3]])
def test_the_exchange_that_ends_the_excess_leaves_the_light_bin_fullest(at_cap):
    # Cap 10: {6, 5} is 1 over; {5, 4} has room 1, {1} room 9. Moving the 6 or the 5 to {1},
    # or swapping the 6 for the 5 or the 5 for the 4, each ends the excess; the swaps fill
    # {5, 4} to 10 (best fit), and of the two the lower item (the 6) goes first. A bin {7, 3}
    # beside, exactly at the cap, neither gives nor takes: the same pass, the same charge.
    sizes = np.array([6, 5, 5, 4, 1, *at_cap])
    bin_of = np.array([0, 0, 1, 1, 2] + [3] * len(at_cap))
    work = Work(10**6)
    assert repair(bin_of, sizes, 3 + bool(at_cap), 10, work)
    assert bin_of.tolist() == [1, 0, 0, 1, 2] + [3] * len(at_cap)
    # One pass: the 5 items and 3 bins searched, the 2 heavy items' candidates.
    assert work.spent == pass_visits(2, 5 + 3) + PASS_OVERHEAD


def test_a_heavy_bin_whose_light_bin_was_taken_chooses_again_in_the_same_pass():
    # Cap 10: two {6, 5} bins, 1 over each, both best served by swapping their 6 for the 5 of
    # {5, 4}; the first (lower item) takes it, the second moves its 6 to {1} (room 9).
    sizes = np.array([6, 5, 6, 5, 5, 4, 1])
    bin_of = np.array([0, 0, 1, 1, 2, 2, 3])
    work = Work(10**6)
    assert repair(bin_of, sizes, 4, 10, work)
    assert bin_of.tolist() == [2, 0, 3, 1, 0, 2, 3]
    assert work.spent == pass_visits(4, 7 + 4) + PASS_OVERHEAD  # one pass


def test_a_bin_with_no_room_anywhere_is_left_as_it_is():
    sizes = np.array([6, 6, 10])
    bin_of = np.array([0, 0, 1])
    assert not repair(bin_of, sizes, 2, 10, Work(10**6))
    assert bin_of.tolist() == [0, 0, 1]


def test_a_second_pass_sees_where_the_first_moved_the_items():
    # Cap 12: {10, 9} is 7 over, {6} has room 6. The first pass swaps the 10 for the 6 (a shift
    # of 4 ends 4 of the excess and fills {10} to 10, where moving the 9 would gain as much
    # and leave 15). The second pass starts from {9, 6}, 3 over, beside {10}: nothing lowers
    # it (25 tokens do not fit 24). The kick moves the 6 to {10} (4 over), the next pass moves
    # it back (3 over): no lower than the stall, so the repair fails with the packing of the
    # stall, the swap made, the 6 in bin 1: four passes, and at both stalls a search for
    # chains, which finds none (no item is 3 below the 9 or the 6 outside their bin).
    sizes = np.array([10, 9, 6])
    bin_of = np.array([1, 1, 0])
    work = Work(10**6)
    assert not repair(bin_of, sizes, 2, 12, work)
    assert bin_of.tolist() == [0, 1, 1]
    assert work.spent == 6 * (pass_visits(2, 3 + 2) + PASS_OVERHEAD)


def test_a_stall_kicks_its_smallest_item_to_the_roomiest_bin_and_the_repair_goes_on():
    # Cap 14: {1, 3, 10, 7, 2} is 9 over, {5} has room 9. The first pass moves the 10 (gain
    # 8), leaving {5, 10} 1 over beside {1, 3, 7, 2}, room 1: no item fits it, no swap shifts
    # 1 (nothing of 4 or 9). The kick moves the 5 there (4 over), and two passes move the 3
    # and the 1 back: {10, 3, 1} and {5, 7, 2}, both at the cap; without the kick it stops 1
    # over. Four passes: the heavy bins held 5, 2, 5 and 4 items; and at the stall a search
    # for chains (heavy bin of 2 items), which finds none: no third bin to pass a shift on to.
    sizes = np.array([5, 1, 3, 10, 7, 2])
    bin_of = np.array([0, 1, 1, 1, 1, 1])
    work = Work(10**6)
    assert repair(bin_of, sizes, 2, 14, work)
    assert bin_of.tolist() == [1, 0, 0, 0, 1, 1]
    assert work.spent == sum(pass_visits(h, 6 + 2) + PASS_OVERHEAD for h in (5, 2, 5, 4, 2))


def test_a_stall_passes_the_excess_through_a_bin_at_the_cap_to_one_with_room():
    # Cap 30: {12, 10, 9} is 1 over; {11, 19} is at the cap; {18, 4, 7} has room 1. No
    # exchange with {18, 4, 7} ends the excess (each shifts 2 or more into a room of 1). The
    # chain: the 12 swaps with the 11 (a shift of 1: {11, 10, 9} at the cap), and {12, 19},
    # now 1 over, passes it on: its 19 swaps with the 18 (room 1). Every bin ends at the cap.
    # One pass over the 6 items and 2 bins not at the cap, one search for chains over all 8
    # items and 3 bins, both with the 3 heavy items.
    sizes = np.array([12, 10, 9, 11, 19, 18, 4, 7])
    bin_of = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    work = Work(10**6)
    assert repair(bin_of, sizes, 3, 30, work)
    assert bin_of.tolist() == [1, 0, 0, 0, 2, 1, 2, 2]
    assert work.spent == pass_visits(3, 6 + 2) + pass_visits(3, 8 + 3) + 2 * PASS_OVERHEAD


def test_a_chain_reaches_past_the_items_just_below_the_heavy_ones():
    # Cap 100: {47, 54} is 1 over; {5, 54} has room 41, too little for a move or a swap that
    # ends the excess. Eight bins at the cap, {d, 100 - d} for d = 39..46, hold the items
    # just below 47 and 54: a swap with d leaves its bin 47 - d over, more than its other
    # item passes on (it swaps with the 54 of room 41: 46 - d). Beyond them, {30, 38, 32}
    # at the cap takes the 47 for its 30 (17 over) and passes that on: its 38 for the 5.
    decoys = [size for d in range(39, 47) for size in (d, 100 - d)]
    sizes = np.array([47, 54, 30, 38, 32, 5, 54, *decoys])
    bin_of = np.array([0, 0, 1, 1, 1, 2, 2, *np.repeat(np.arange(3, 11), 2)])
    load = np.bincount(bin_of, weights=sizes, minlength=11).astype(np.int64)
    ex = _chains(ascending(sizes), bin_of, sizes, load, np.array([0]), 100, whole=False)
    assert list(zip(ex.heavy, ex.light, sizes[ex.give], sizes[ex.take], strict=True)) == [
        (0, 1, 47, 30),
        (1, 2, 38, 5),
    ]


def test_a_zero_budget_starts_no_pass_and_a_lone_item_over_the_cap_needs_none():
    sizes = np.array([6, 5, 1])
    bin_of = np.array([0, 0, 1])
    work = Work(0)
    assert not repair(bin_of, sizes, 2, 10, work)
    assert bin_of.tolist() == [0, 0, 1] and work.spent == 0
    assert repair(np.array([0, 1]), np.array([12, 3]), 2, 10, work)  # {12} alone is its own


def test_kicks_that_lower_the_excess_too_little_for_the_budget_stop_at_the_second_stall():
    # 815 truncated samples into 483 bins of 4,096 (L2's count, 95% full), from largest fit in
    # rounds: the passes stall 3,532 tokens over; a kick, and the next stall is 3,529 over, 3
    # tokens for a kick's cycle, at which rate the budget left (200 visits a sample) cannot
    # remove the rest. Before this stop the kicks crept on to 3,180 over in six cycles, for
    # 158,004 of the 163,000 visits; now the repair ends there, after 47,502 (32,272 and a
    # search for chains at each stall: both find some, none that end the excess, which is
    # all a repair too slow to end it takes).
    rng = np.random.default_rng([15, 77])
    n = int(rng.integers(200, 1200))
    sizes = lengths_of("truncated", rng, n, 4096)
    bins = 483
    bin_of = fit_rounds(sizes, bins, 4096)
    work = Work(200 * n)
    assert not repair(bin_of, sizes, bins, 4096, work)
    assert work.spent < 50_000
    assert _excess(bin_of, sizes, bins, 4096) <= 3_532
    assert (np.bincount(bin_of, minlength=bins) > 0).all()


def test_a_spill_sheds_each_bins_excess_and_packs_what_it_shed_into_new_bins():
    # Cap 10. {6, 3, 2} is 1 over: the smallest item of at least 1 is the 2. {5, 4, 4} is 3
    # over: the first 4. {4, 4, 4, 4} is 6 over and no item is that large: its largest items
    # go while those above them hold less than 6, two 4s (the last two), leaving 8. {9, 1} is
    # within the cap. The shed 2, 4, 4, 4 pack by first-fit decreasing (of equal items the
    # later first) into {4, 4, 2} (items 9, 8, 2) and {4} (item 4): bins 4 and 5.
    sizes = np.array([6, 3, 2, 5, 4, 4, 4, 4, 4, 4, 9, 1])
    bin_of = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3])
    assert spill(bin_of, sizes, 4, 10) == 6
    assert bin_of.tolist() == [0, 0, 4, 1, 5, 1, 2, 2, 4, 4, 3, 3]


@st.composite
def packings(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, int]:
    cap = draw(st.integers(4, 60))
    bins = draw(st.integers(1, 12))
    n = draw(st.integers(bins, 60))
    sizes = np.array(draw(st.lists(st.integers(1, cap), min_size=n, max_size=n)))
    rest = draw(st.lists(st.integers(0, bins - 1), min_size=n - bins, max_size=n - bins))
    bin_of = np.array(draw(st.permutations([*range(bins), *rest])))  # every bin non-empty
    return sizes, bin_of, bins, cap


def _excess(bin_of: np.ndarray, sizes: np.ndarray, bins: int, cap: int) -> int:
    load = np.bincount(bin_of, weights=sizes, minlength=bins)
    counts = np.bincount(bin_of, minlength=bins)
    return int(np.maximum(load - cap, 0)[counts > 1].sum())


@PROPERTY
@given(packings(), st.integers(0, 200_000))
def test_a_repair_keeps_every_bin_and_its_budget_and_never_adds_excess(case, budget):
    sizes, bin_of, bins, cap = case
    before = _excess(bin_of, sizes, bins, cap)
    work = Work(budget)
    within = repair(bin_of, sizes, bins, cap, work)
    assert work.spent <= budget
    assert (np.bincount(bin_of, minlength=bins) > 0).all() and bin_of.max() < bins
    after = _excess(bin_of, sizes, bins, cap)
    assert after <= before
    assert within == (after == 0)


@PROPERTY
@given(packings())
def test_chains_leave_every_bin_they_touch_within_the_cap_and_every_count_as_it_was(case):
    sizes, bin_of, bins, cap = case
    load = np.bincount(bin_of, weights=sizes, minlength=bins).astype(np.int64)
    counts = np.bincount(bin_of, minlength=bins)
    over = np.flatnonzero((load > cap) & (counts > 1))
    ex = _chains(ascending(sizes), bin_of, sizes, load, over, cap, whole=False)
    moved = np.concatenate((ex.give, ex.take))
    assert (ex.take >= 0).all() and np.unique(moved).size == moved.size  # swaps, each item once
    assert (bin_of[ex.give] == ex.heavy).all() and (bin_of[ex.take] == ex.light).all()
    before = _excess(bin_of, sizes, bins, cap)
    apply_exchanges(ex, bin_of, sizes, load, counts)
    touched = np.concatenate((ex.heavy, ex.light))
    assert (load[touched] <= cap).all()
    assert (np.bincount(bin_of, minlength=bins) == counts).all()
    assert _excess(bin_of, sizes, bins, cap) < before or ex.give.size == 0


@PROPERTY
@given(packings())
def test_a_spill_packs_within_the_cap_and_moves_only_what_was_over(case):
    sizes, bin_of, bins, cap = case
    before = bin_of.copy()
    load = np.bincount(before, weights=sizes, minlength=bins)
    over = (load > cap) & (np.bincount(before, minlength=bins) > 1)
    total = spill(bin_of, sizes, bins, cap)
    assert _excess(bin_of, sizes, total, cap) == 0
    assert (np.bincount(bin_of, minlength=total) > 0).all() and bin_of.max() == total - 1
    moved = bin_of != before
    assert over[before[moved]].all() and (bin_of[moved] >= bins).all()
    assert total == bins + (0 if not moved.any() else len(set(bin_of[moved].tolist())))


def test_chains_lower_the_count_and_the_spill_the_counts_the_search_repairs(monkeypatch):
    # 800 GRPO samples, cap 8,192, dp1: K_lb 311, first-fit decreasing needs 316, and the
    # count oracle packs 314 but not 313. The repairs' chains through bins at the cap pack 313
    # (and 312 is tried). Without chains the search's repairs of 313 stop over the cap; their
    # excess shed into new bins packs 314, so no count between is repaired. Without the spill
    # too the bisection tries 315 (first-fit decreasing's packing cut), then 314 (that packing
    # cut): the same count, two more repairs.
    lengths = lengths_of("grpo", np.random.default_rng(67), 800, 8192)
    assert microbatch_lower_bound(lengths, 8192, 1, 1) == 311
    cut = []

    def counted(bin_of: np.ndarray, sizes: np.ndarray, bins: int) -> np.ndarray:
        cut.append(bins)
        return cut_to(bin_of, sizes, bins)

    monkeypatch.setattr(balanced, "cut_to", counted)

    def count() -> int:
        cut.clear()
        strategy = DynamicBatching(ParallelLayout(dp=1), None, 8192)
        step = strategy.plan(lengths.tolist(), list(range(800))).steps[0]
        assert not step_metrics(step, lengths.tolist(), 8192, ParallelLayout(dp=1), (1.0, 0.0))[
            "batch/cap_violations"
        ]
        return step.num_microbatches

    assert (count(), cut) == (313, [313, 312])
    monkeypatch.setattr(repair_module, "_chains", lambda *args, whole: Exchanges.none(0))
    assert (count(), cut) == (314, [313])
    monkeypatch.setattr(balanced, "spill", lambda bin_of, sizes, bins, cap: len(sizes) + 1)
    assert (count(), cut) == (314, [313, 315, 314])


def test_the_count_search_reaches_k_lb_where_paired_exchanges_stall():
    # 4,096 GRPO samples on dp32, 99.2% full at K_lb = 41 (docs/planner.md, tenth round: draw
    # 4): the paired repair stalls over the cap; the whole-step repair packs 41 within the
    # count budget, which 20 visits a sample (the balancing share) does not pay for.
    lengths = lengths_of("grpo", np.random.default_rng([663178406, 4, 4096]), 4096, 16384)
    assert microbatch_lower_bound(lengths, 16384, 32, 1) == 41

    def count(per_sample: int) -> int:
        packer = BalancedPacker(repair_budget_per_sample=per_sample)
        strategy = DynamicBatching(ParallelLayout(dp=32), None, 16384, partitioner=packer)
        return strategy.plan(lengths.tolist(), list(range(4096))).steps[0].num_microbatches

    assert count(BalancedPacker.repair_budget_per_sample) == 41
    assert count(20) == 42


def test_a_slowing_repair_kicks_and_packs_the_count_first_fit_decreasing_misses():
    # 4,096 GRPO samples on dp32, none under 2,493 tokens (the bench's scale curve, seed
    # 159175358): K_lb 56, an LP over the bins proves 57 (1,794 bins), first-fit decreasing
    # needs 58. The repair of 57 slows past what its budget can finish before it stalls 60
    # tokens over 4 bins; kicking at the slowdown, not only at a stall, packs 57 within the
    # count budget (a stall-only kick plans 58).
    lengths = lengths_of("grpo", np.random.default_rng([159175358, 48]), 4096, 16384)
    assert microbatch_lower_bound(lengths, 16384, 32, 1) == 56
    strategy = DynamicBatching(ParallelLayout(dp=32), None, 16384)
    assert strategy.plan(lengths.tolist(), list(range(4096))).steps[0].num_microbatches == 57
