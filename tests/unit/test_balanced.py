"""partition.balanced, construct, improve, ranks and exchange: the construction, the
exchanges, the rank balancing, the work budget, by hand and as properties over the length
families."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from benchmarks.bench_planner import draw_case
from slime_hydra.partition import BalancedPacker, Work, balanced
from slime_hydra.partition.base import PASS_OVERHEAD
from slime_hydra.partition.bounds import max_part_lower_bound
from slime_hydra.partition.construct import construct, fit_rounds, largest_fit
from slime_hydra.partition.exchange import best_exchanges, bulk_moves
from slime_hydra.partition.greedy import first_fit_decreasing
from slime_hydra.partition.improve import hopeless, improve
from slime_hydra.partition.ranks import capped_ranks, even_groups, own_ranks
from slime_hydra.partition.repair import repair
from slime_hydra.schedule import DynamicBatching, ParallelLayout, step_metrics
from slime_hydra.schedule.metrics import microbatch_lower_bound
from tests.families import FAMILIES, ISOLATE, lengths_of

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _loads(bin_of: np.ndarray, w: np.ndarray, bins: int) -> list[int]:
    return np.bincount(bin_of, weights=w, minlength=bins).astype(int).tolist()


def _planned(lengths: list[int], layout: ParallelLayout, cap: int) -> dict[str, float]:
    """The `batch/*` metrics of the default dynamic plan of one step, balanced by tokens."""
    step = DynamicBatching(layout, None, cap).plan(lengths, list(range(len(lengths)))).steps[0]
    return step_metrics(step, lengths, cap, layout, (1.0, 0.0))


def test_construct_deals_rounds_heaviest_to_the_lightest_bin():
    # Round 0: 5 and 4 open the bins; round 1: the first 3 to the 4, the second to the 5;
    # round 2: the 2 to the lighter (7), the 1 to the 8: 9 and 9.
    w = np.array([5, 4, 3, 3, 2, 1])
    bin_of = construct(w, 2, 0.01)
    assert bin_of.tolist() == [0, 1, 1, 0, 1, 0]
    assert _loads(bin_of, w, 2) == [9, 9]


def test_construct_pours_light_items_into_each_bins_room_below_the_mean():
    # Two bins of 100 and 60: a round of 1s cannot close the gap of 40, so the 1s are poured
    # into the room below the water level, 180: 180 and 180.
    w = np.array([100, 60] + [1] * 200)
    bin_of = construct(w, 2, 0.01)
    assert _loads(bin_of, w, 2) == [180, 180]


@PROPERTY
@given(st.sampled_from(sorted(FAMILIES)), st.integers(0, 2**32 - 1), st.integers(1, 300))
def test_construct_fills_every_bin_within_one_item_of_the_mean(family, seed, bins):
    rng = np.random.default_rng(seed)
    w = lengths_of(family, rng, int(rng.integers(bins, 4 * bins + 50)), 4096)
    loads = np.asarray(_loads(construct(w, bins, 0.01), w, bins))
    counts = np.bincount(construct(w, bins, 0.01), minlength=bins)
    assert (counts > 0).all()
    assert loads.max() <= w.sum() / bins + w.max()


def test_construct_deals_many_rounds_in_snake_order_then_one_round_at_a_time():
    # 100 and 99 open two bins; the 11 rounds of two after them (98 and 97, ..., 78 and 77)
    # go in snake order over the bins lightest first (the 99's, then the 100's), then
    # reversed, ...: the first three at once, the last LPT_TAIL one at a time, and both
    # orders agree here, so each bin ends at 1,062, half of the 2,124.
    w = np.arange(100, 76, -1)
    bin_of = construct(w, 2, 0.01)
    rounds = [[1, 0] if r % 2 == 0 else [0, 1] for r in range(11)]
    assert bin_of.tolist() == [0, 1] + [b for pair in rounds for b in pair]
    assert _loads(bin_of, w, 2) == [1062, 1062]


@PROPERTY
@given(st.sampled_from(sorted(FAMILIES)), st.integers(0, 2**32 - 1), st.integers(1, 12))
def test_construct_of_few_bins_and_many_rounds_fills_each_within_one_item_of_the_mean(
    family, seed, bins
):
    rng = np.random.default_rng(seed)
    w = lengths_of(family, rng, int(rng.integers(10 * bins, 400 * bins)), 4096)
    bin_of = construct(w, bins, 0.01)
    assert (np.bincount(bin_of, minlength=bins) > 0).all()
    assert max(_loads(bin_of, w, bins)) <= w.sum() / bins + w.max()


def test_construct_fills_up_to_the_bound_where_the_mean_leaves_an_item_no_room():
    # 60, 52 and 30 open the bins; the level of what is left is 68⅓, so the rooms are 8, 16
    # and 38: the 28 and two 10s fill them, the third 10 fits no room and would make 52 + 10 +
    # 10 = 72 in the lightest bin. Filled to the proven bound, 70, instead: {60, 10}, {52, 10,
    # 5}, {30, 28, 10}, the optimum (60 + 5 leaves 140 for two bins of at most 69).
    w = np.array([60, 52, 30, 28, 10, 10, 10, 5])
    assert max(_loads(construct(w, 3, 0.01), w, 3)) == 70


def test_construct_deals_the_items_that_fit_no_room_before_filling_the_rooms():
    # 33, 20 and 19 open the bins; the level of what is left is 29, so the rooms are 0, 9 and
    # 10: the 14 fits none and goes first to the lightest bin (19: 33), the 1 then to a room
    # (20: 21). Filling the rooms first would give the 1 to the 19 and the 14 to the 20 (34).
    w = np.array([33, 20, 19, 14, 1])
    assert max(_loads(construct(w, 3, 0.01), w, 3)) == 33


def test_counts_below_first_fit_decreasing_are_bisected_not_walked(monkeypatch):
    # 600 items of 0.34 of the cap fill 300 bins, two each, and no fewer. Offered every count
    # from 100 up, first-fit decreasing packs 300 and the 200 counts below it fail: trying
    # each (a repair with the whole budget apiece) took seconds on near-full steps.
    tried = []

    def counted(sizes, bins, cap):
        tried.append(bins)
        return fit_rounds(sizes, bins, cap)

    monkeypatch.setattr(balanced, "fit_rounds", counted)
    sizes = np.full(600, 340)
    found = BalancedPacker(budget=2000)(sizes, sizes, range(100, 601), 1000, Work(2000))
    assert found is not None and found[0] == 300
    assert np.bincount(found[1]).tolist() == [2] * 300
    assert len(set(tried)) <= 10  # ⌈log2(200)⌉ + 2


def test_a_count_below_one_packed_is_cut_from_that_packing_not_first_fit_decreasings():
    # 300 GRPO samples under a cap of 4,096: at least 101 bins, first-fit decreasing packs
    # 103. The search packs 102, then cuts that packing to 101 and repairs it within the cap;
    # first-fit decreasing's packing cut to 101 (two bins' items over the others) did not.
    s = lengths_of("grpo", np.random.default_rng([75, 300]), 300, 4096)
    assert int(np.ceil(s.sum() / 4096)) == 101 and first_fit_decreasing(s, 4096).max() == 102
    found = BalancedPacker()(s, s, range(101, 301), 4096, Work(100_000))
    assert found is not None and found[0] == 101
    assert max(_loads(found[1], s, 101)) <= 4096 and min(np.bincount(found[1])) >= 1


def test_where_ffd_packs_the_count_the_plan_starts_from_the_construction_repaired():
    # 1,000 GRPO samples in 281 micro-batches of 4,096 (95% full): the balanced construction
    # and largest fit both break the cap, first-fit decreasing packs 281 with its bins full
    # and its last ones nearly empty. With no balancing work the plan is where it starts: the
    # construction repaired within the cap leaves no bin below 0.9 of the mean (FFD's packing
    # left one at 1,161 of 3,895).
    s = lengths_of("grpo", np.random.default_rng(19), 1000, 4096)
    found = BalancedPacker()(s, s, [281], 4096, Work(0))
    assert found is not None and found[0] == 281
    loads = np.asarray(_loads(found[1], s, 281))
    assert loads.max() <= 4096
    assert loads.min() >= 0.9 * s.sum() / 281


def test_a_step_whose_mean_bin_is_within_half_the_tolerance_of_the_cap_is_full():
    # tolerance 0.01: balancing stops at 1.005 x the mean, which reaches a cap of 1,000 from a
    # mean of 995.03 up: 995 is not full, 995.5 is; by FLOPs the goal is not in tokens.
    packer = BalancedPacker(tolerance=0.01)
    s = np.array([995, 995])
    assert not packer._full(s, s, 2, 1000)
    s = np.array([996, 995])
    assert packer._full(s, s, 2, 1000)
    assert not packer._full(s, s * s, 2, 1000)
    # A largest item near the cap lifts the goal, not the bins' fill: 998 beside a 2 is not.
    s = np.array([998, 2])
    assert not packer._full(s, s, 2, 1000)


def test_a_full_step_is_first_fit_decreasings_packing_without_the_construction(monkeypatch):
    # 8, 6, 4, 3, 3 fill 2 bins of 12 exactly: the construction's rounds give {8, 3} = 11
    # and {6, 4, 3} = 13, over the cap; FFD packs {8, 4} and {6, 3, 3}, the plan as it is.
    built = []

    def counted(weights, bins, tolerance):
        built.append(bins)
        return construct(weights, bins, tolerance)

    s = np.array([8, 3, 6, 4, 3])
    assert sorted(_loads(construct(s, 2, 0.01), s, 2)) == [11, 13]
    monkeypatch.setattr(balanced, "construct", counted)
    found = BalancedPacker()(s, s, [2], 12, Work(100_000))
    assert found is not None and found[0] == 2
    assert sorted(np.flatnonzero(found[1] == b).tolist() for b in range(2)) == [[0, 3], [1, 2, 4]]
    assert built == []


def test_a_full_step_largest_fit_packs_is_its_plan_without_first_fit_decreasing(monkeypatch):
    # 6, 6, 4, 4, 2, 2 fill 2 bins of 12. Largest fit in rounds: the 6s open, the 4s then
    # the 2s go to the roomiest, {6, 4, 2} twice, within the cap: the plan, with no FFD
    # (which would pack {6, 6} and {4, 4, 2, 2}).
    def no_ffd(sizes, cap):
        raise AssertionError("first-fit decreasing computed")

    monkeypatch.setattr(balanced, "first_fit_decreasing", no_ffd)
    s = np.array([6, 6, 4, 4, 2, 2])
    found = BalancedPacker()(s, s, [2], 12, Work(100_000))
    assert found is not None and found[0] == 2
    assert sorted(np.flatnonzero(found[1] == b).tolist() for b in range(2)) == [
        [0, 2, 4],
        [1, 3, 5],
    ]


def test_fit_rounds_gives_each_bin_the_largest_item_that_fits():
    # 7, 6 and 5 open the bins (room 3, 4, 5); the roomiest (5) takes the 4, the next (4)
    # the 3, and the 7's bin nothing: 7, 9, 9, all within 10.
    s = np.array([7, 6, 5, 4, 3])
    bin_of = fit_rounds(s, 3, 10)
    assert _loads(bin_of, s, 3) == [7, 9, 9]


def test_the_packer_refuses_what_fits_no_way_and_the_lpt_overflow_it_repairs():
    packer = BalancedPacker()
    # Three 6s leave rooms of 4: the 5 fits nowhere, and first-fit decreasing needs 4 bins.
    s = np.array([6, 6, 6, 5])
    assert packer(s, s, [3], 10, Work(10**6)) is None
    # LPT ends at {6, 3, 2} = 11 and {4, 3, 2} = 9, and one swap of a 3 for a 2 repairs it:
    # {6, 2, 2} and {4, 3, 3}.
    s = np.array([6, 4, 3, 3, 2, 2])
    assert sorted(_loads(construct(s, 2, 0.01), s, 2)) == [9, 11]
    assert packer(s, s, [2], 10, Work(10**6))[0] == 2
    _, bin_of = packer(s, s, [2], 10, Work(10**6))
    assert sorted(_loads(bin_of, s, 2)) == [10, 10]


def test_the_bins_that_hold_one_item_more_take_the_smallest():
    # Seven items in 3 bins: rounds of three end at 19, 19, 19 and the 8 makes one 27. Given
    # one bin's three items apart, the smallest (9 + 9 + 8 = 26, the least any three weigh),
    # and the largest two each to the others: 20, 19 and 26.
    s = np.array([10, 10, 10, 9, 9, 9, 8])
    assert sorted(_loads(construct(s, 3, 0.01), s, 3)) == [19, 20, 26]
    # Where B divides n, every bin holds as many: the rounds as they are.
    s = np.array([10, 10, 9, 9, 8, 8])
    assert sorted(_loads(construct(s, 3, 0.01), s, 3)) == [18, 18, 18]


def test_the_best_exchange_lands_nearest_half_the_gap():
    # Heavy {8, 3} = 11, light {2}: gap 9, aim 4. Moving the 3 shifts 3 (off by 1); swapping
    # 8 for 2 shifts 6 (off by 2); moving the 8 shifts 8: so the 3 moves.
    bin_of = np.array([0, 0, 1])
    w = np.array([8, 3, 2])
    load = np.array([11, 2])
    ex = best_exchanges(
        bin_of,
        w,
        w,
        np.array([0]),
        np.array([1]),
        np.array([9]),
        np.array([9]),
        load,
        np.array([2, 1]),
        100,
        np.ones(3, dtype=bool),
    )
    assert (ex.give.tolist(), ex.take.tolist()) == ([1], [-1])


def test_a_repair_exchange_stays_within_the_light_bins_room():
    # Heavy {6, 3} = 9 over the cap of 8, light {4, 2} = 6 with room 2: the aim is min(3/2, 2)
    # = 1, the 3 for the 2: 8 and 7, both within the cap. Moving the 3 would make the light 9.
    bin_of = np.array([0, 0, 1, 1])
    s = np.array([6, 3, 4, 2])
    load = np.array([9, 6])
    ex = best_exchanges(
        bin_of,
        s,
        s,
        np.array([0]),
        np.array([1]),
        np.array([3]),
        np.array([2]),
        load,
        np.array([2, 2]),
        8,
        np.ones(4, dtype=bool),
    )
    assert (ex.give.tolist(), ex.take.tolist()) == ([1], [3])


def test_bulk_moves_take_the_lightest_items_up_to_the_shift_and_leave_one():
    bin_of = np.array([0, 0, 0, 0, 1])
    w = np.array([5, 1, 1, 2, 3])
    ex = bulk_moves(
        bin_of,
        w,
        w,
        np.array([0]),
        np.array([1]),
        np.array([3]),
        np.array([100]),
        np.array([4, 1]),
        np.ones(5, dtype=bool),
    )
    assert sorted(ex.give.tolist()) == [1, 2]  # 1 + 1 <= 3; adding the 2 would pass it
    ex = bulk_moves(
        bin_of,
        w,
        w,
        np.array([0]),
        np.array([1]),
        np.array([100]),
        np.array([100]),
        np.array([4, 1]),
        np.ones(5, dtype=bool),
    )
    assert sorted(ex.give.tolist()) == [1, 2, 3]  # never the last item: the 5 stays


def test_own_ranks_set_the_heavy_items_apart_with_the_lightest_beside_them():
    # 143 over 4 groups of 2 bins, 35.75 each: the 100 is over that, alone in a bin, the 1 in
    # its group's other. 42 is left for 3 groups, 14 each: the 9 and the 8 are over half of
    # it. The 9's group takes the lightest left where the running sum of the needs (5, then
    # 5 + 6) falls nearest: the 3 and the 4 (16); the 8's the 5 (13). The 7 and the 6 are
    # left for the last group.
    items, bins, groups = own_ranks(np.array([100, 3, 1, 9, 8, 7, 6, 5, 4]), 4, 2)
    assert groups == 3
    placed = dict(zip(items.tolist(), bins.tolist(), strict=True))
    assert placed == {0: 0, 3: 2, 4: 4, 2: 1, 1: 3, 8: 3, 7: 5}


def test_capped_ranks_fill_the_other_ranks_to_the_cap_and_pour_the_rest_beside_an_over_cap_item():
    # Cap 10, three ranks of three bins: an 18 and forty 2s. The other ranks' six bins take five
    # 2s each (30 a rank); the ten left (20) go beside the 18, 10 a bin (its capacity: 38).
    sizes = np.array([18] + [2] * 40)
    bin_of = capped_ranks(sizes, 3, 3, 10)
    assert bin_of is not None and bin_of[0] == 0
    assert _loads(bin_of, sizes, 9) == [18] + [10] * 8


def test_capped_ranks_level_the_over_cap_items_ranks_as_far_as_their_bins_hold():
    # Cap 10, four ranks of two bins: a 19, a 13 and twenty-six 2s. The two ranks without one
    # take five 2s a bin; twelve tokens are left. Levelled, the 13's rank would take 9, but a bin
    # beside it holds 8 (the cap less the largest item left, so that pouring stays under it):
    # the 19 takes the other 4, ranks 23, 21, 20, 20.
    sizes = np.array([19, 13] + [2] * 26)
    bin_of = capped_ranks(sizes, 4, 2, 10)
    assert bin_of is not None and bin_of[:2].tolist() == [0, 2]
    assert _loads(bin_of, sizes, 8) == [19, 4, 13, 8, 10, 10, 10, 10]


@PROPERTY
@given(
    st.integers(0, 2**32 - 1),
    st.integers(2, 24),
    st.integers(2, 6),
    st.sampled_from([64, 256, 4096]),
    st.floats(0.8, 1.3),
)
def test_capped_ranks_place_every_item_once_within_the_cap_and_alone_over_it(
    seed, groups, k, cap, fill
):
    # Over-cap items on up to every rank but one, and small ones about `fill` times what the
    # other ranks' bins hold (more than they hold: the steps capped_ranks is for).
    rng = np.random.default_rng(seed)
    over = rng.integers(cap + 1, 2 * cap, int(rng.integers(1, groups)))
    small = rng.integers(1, cap // 8 + 2, int(fill * (groups - over.size) * k * cap / (cap / 16)))
    sizes = rng.permutation(np.concatenate((over, small)))
    bin_of = capped_ranks(sizes, groups, k, cap)
    assume(bin_of is not None)
    assert bin_of.shape == sizes.shape and bin_of.min() >= 0 and bin_of.max() < groups * k
    counts = np.bincount(bin_of, minlength=groups * k)
    loads = np.bincount(bin_of, sizes, groups * k)
    assert (counts > 0).all()
    assert ((loads <= cap) | (counts == 1)).all()
    heavy = np.flatnonzero(sizes > cap)
    assert sorted(bin_of[heavy].tolist()) == [r * k for r in range(heavy.size)]  # a rank each


def test_capped_ranks_need_fewer_over_cap_items_than_ranks_and_two_bins_a_rank():
    assert capped_ranks(np.array([18, 19] + [2] * 20), 2, 3, 10) is None  # no rank left
    assert capped_ranks(np.array([18] + [2] * 20), 3, 1, 10) is None  # k < 2
    assert capped_ranks(np.array([2] * 20), 3, 2, 10) is None  # none over the cap


def test_own_ranks_set_none_apart_where_heavy_items_take_every_group_or_none_is_heavy():
    # Five 50s over 4 groups (63.75 each): heavy items on every group leave none for the rest.
    assert own_ranks(np.array([50] * 5 + [1] * 5), 4, 2) is None
    # Equal items: none is over half a group's share (10 of 20).
    assert own_ranks(np.array([10] * 8), 4, 2) is None


@PROPERTY
@given(
    st.sampled_from(sorted(FAMILIES)),
    st.integers(0, 2**32 - 1),
    st.integers(8, 2000),
    st.sampled_from([2, 3, 4, 8, 16, 64]),
    st.integers(2, 8),
    st.integers(1, 80),
)
def test_own_ranks_give_each_heavy_item_a_group_of_k_nonempty_bins_and_leave_the_rest_enough(
    family, seed, n, dp, k, heavy
):
    # A family's lengths and `heavy` items of 0.3-1.5 groups' shares: fewer than the groups,
    # as many, or more.
    rng = np.random.default_rng(seed)
    weights = lengths_of(family, rng, n, 8192)
    share = int(weights.sum()) // dp + 1
    weights = np.concatenate((weights, rng.integers(3 * share // 10, 3 * share // 2, heavy)))
    apart = own_ranks(weights, dp, k)
    assume(apart is not None)
    items, bins, groups = apart
    assert 0 < groups < dp
    assert np.unique(items).size == items.size
    counts = np.bincount(bins, minlength=groups * k)
    assert counts.size == groups * k and (counts > 0).all()
    assert (counts[::k] == 1).all()  # each heavy item alone in its group's first bin
    rest = np.setdiff1d(np.arange(weights.size), items)
    assert rest.size >= (dp - groups) * k
    heavy = weights[items[bins % k == 0]]
    assert heavy.min() >= weights[rest].max()


def test_even_groups_moves_weight_from_the_heavier_group():
    # One bin per group: {6, 2} and {2}. The 2 moves (a shift of 2 of the gap 6), then no
    # exchange brings 6 and 4 closer: 6 and 4.
    bin_of = np.array([0, 0, 1])
    w = np.array([6, 2, 2])
    even_groups(bin_of, w, w, 2, 100, 0.0, Work(10**6))
    assert _loads(bin_of, w, 2) == [6, 4]


@st.composite
def packing_cases(draw: st.DrawFn):
    family = draw(st.sampled_from(sorted(set(FAMILIES) - ISOLATE)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cap = int(draw(st.sampled_from([1024, 4096, 16384])))
    sizes = lengths_of(family, rng, draw(st.integers(2, 600)), cap)
    bins = draw(st.integers(1, len(sizes)))
    flops = draw(st.booleans())
    weights = sizes + sizes * sizes // 64 if flops else sizes
    return sizes, weights, bins, cap


@PROPERTY
@given(packing_cases(), st.integers(0, 400_000))
def test_a_packing_keeps_its_invariants_and_its_budget(case, budget):
    sizes, weights, bins, cap = case
    work = Work(budget)
    found = BalancedPacker(budget=budget)(sizes, weights, [bins], cap, work)
    # A pass takes only the pairs the budget left pays for (repairs have their own).
    assert work.spent <= budget
    if found is None:
        return
    assert found[0] == bins
    bin_of = found[1]
    counts = np.bincount(bin_of, minlength=bins)
    assert len(counts) == bins and (counts > 0).all()
    loads = np.bincount(bin_of, weights=sizes, minlength=bins)
    assert ((loads <= cap) | (counts == 1)).all()


def test_a_repair_stops_where_the_budget_left_cannot_remove_the_excess_at_its_rate():
    # Bins {6, 6}, {11}, {3, 2} under a cap of 10: 2 over it where two items share a bin (the
    # lone 11 is not repaired, so its bin is not among those over). A pass that cost 100 visits
    # took the excess from 6 to 2, so 2 more need 50 visits at its rate.
    was_over = np.array([12])
    assert not hopeless(was_over, 10, 6, Work(150, spent=100), 100)  # 50 left
    assert hopeless(was_over, 10, 6, Work(149, spent=100), 100)  # 49 left
    assert not hopeless(was_over, 10, 2, Work(100, spent=100), 100)  # no cut: no rate


def test_balancing_that_cannot_reach_its_goal_stops_after_a_pass_not_its_budget():
    # 1,000 bins of ten 10s and 10 bins of one: every full bin must lose a 10 to get below
    # 99.5, which the 10 light ones cannot take. Each pass lowers 10 bins; at that rate half
    # the budget the whole run spends is not enough, so it stops at once (it spent 38,305 of
    # 38,974 visits before); nothing got heavier.
    def full_bins() -> tuple[np.ndarray, np.ndarray]:
        sizes = np.full(10_010, 10, dtype=np.int64)
        return np.concatenate((np.repeat(np.arange(1000), 10), 1000 + np.arange(10))), sizes

    bin_of, sizes = full_bins()
    whole = Work(10**12)
    improve(bin_of, sizes, sizes, 1010, 10_000, 99.5, whole)
    bin_of, sizes = full_bins()
    half = Work(whole.spent // 2)
    improve(bin_of, sizes, sizes, 1010, 10_000, 99.5, half)
    assert half.spent < half.budget / 4
    assert np.bincount(bin_of, weights=sizes).max() == 100


def test_paired_repair_passes_hand_the_excess_to_the_whole_step_repair_once_they_slow():
    # Largest fit of 16,384 GRPO samples in 6,720 micro-batches of 16,384 tokens: the paired
    # passes cut its excess to 157,541 tokens in five passes, then by 12-15% a pass. Handed over
    # there, the whole-step repair packs it in 505,453 visits; run until their rate gave out,
    # the paired passes left it 88,024 over and the repair took 609,677.
    sizes = lengths_of("grpo", np.random.default_rng([1005, 0, 16384, 2]), 16384, 16384)
    bin_of = fit_rounds(sizes, 6720, 16384)
    work = Work(1_700_000)
    assert improve(bin_of, sizes, sizes, 6720, 16384, 16384, work)
    assert np.bincount(bin_of, weights=sizes, minlength=6720).max() <= 16384
    assert work.spent < 550_000


@PROPERTY
@given(packing_cases(), st.integers(0, 100_000))
def test_a_cap_repair_keeps_its_budget(case, budget):
    # A repair pass visited every pair it made, whatever was left: 2.2M visits on a budget of
    # 100,000 at 1M samples.
    sizes, weights, bins, cap = case
    bin_of = fit_rounds(sizes, bins, cap)  # over the cap where items fitted nowhere
    work = Work(budget)
    within = improve(bin_of, sizes, weights, bins, cap, cap, work)
    assert work.spent <= budget
    counts = np.bincount(bin_of, minlength=bins)
    assert len(counts) == bins and (counts > 0).all()
    if within:
        loads = np.bincount(bin_of, weights=sizes, minlength=bins)
        assert ((loads <= cap) | (counts == 1)).all()


@PROPERTY
@given(packing_cases(), st.integers(1, 8), st.integers(0, 400_000), st.booleans())
def test_evening_groups_keeps_the_packings_invariants_and_its_budget(
    case, groups, budget, givers_first
):
    sizes, weights, bins, cap = case
    k = max(1, bins // groups)
    bins = groups * k
    if bins > len(sizes):
        return
    bin_of = construct(weights, bins, 0.01)
    top = max(_loads(bin_of, weights, bins))
    over = max(_loads(bin_of, sizes, bins)) > cap
    work = Work(budget)
    even_groups(bin_of, sizes, weights, groups, cap, 0.0025, work, givers_first=givers_first)
    # Each pass takes only the bin pairs what is left pays for, both its searches counted.
    assert work.spent <= budget
    assert (np.bincount(bin_of, minlength=bins) > 0).all()
    assert max(_loads(bin_of, weights, bins)) <= top
    if not over:
        counts = np.bincount(bin_of, minlength=bins)
        assert ((np.bincount(bin_of, weights=sizes, minlength=bins) <= cap) | (counts == 1)).all()


@PROPERTY
@given(packing_cases())
def test_improving_never_raises_the_heaviest_bin_and_a_zero_budget_changes_nothing(case):
    sizes, weights, bins, cap = case
    bin_of = construct(weights, bins, 0.01)
    before = bin_of.copy()
    improve(bin_of, sizes, weights, bins, cap, 0, Work(0))
    assert (bin_of == before).all()
    top = max(_loads(bin_of, weights, bins))
    sizes_top = max(_loads(bin_of, sizes, bins))
    improve(bin_of, sizes, weights, bins, cap, 0, Work(10**6))
    assert (np.bincount(bin_of, minlength=bins) > 0).all()
    if sizes_top <= cap:  # no repair needed: balancing only lowers the heaviest bin
        assert max(_loads(bin_of, weights, bins)) <= top


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - ISOLATE))
def test_the_same_items_pack_the_same_way_twice(family):
    rng = np.random.default_rng(3)
    s = lengths_of(family, rng, 3000, 16384)
    bins = int(np.ceil(s.sum() / 16384)) + 2
    a = BalancedPacker()(s, s, [bins], 16384, Work(100_000))
    b = BalancedPacker()(s.copy(), s.copy(), [bins], 16384, Work(100_000))
    assert (a is None and b is None) or (a[1] == b[1]).all()


def test_even_groups_stops_at_once_where_a_locked_sample_sets_the_heaviest_group():
    # Rank 0 holds an over-cap sample of 100 alone (locked) and a 1; rank 1 holds 5 and 5.
    # No exchange can take rank 0 below 100 + 1 (its other bin keeps an item), so it is at
    # its floor: nothing to spend the work on (it used to try every partner first).
    sizes = np.array([100, 1, 5, 5])
    bin_of = np.array([0, 1, 2, 3])
    work = Work(10**6)
    fixed = np.array([True, False, False, False])
    even_groups(bin_of, sizes, sizes, 2, 50, 0.0025, work, fixed)
    assert bin_of.tolist() == [0, 1, 2, 3] and work.spent == 0


def test_even_groups_pairs_open_bins_past_a_locked_one():
    # Rank 0: an over-cap 60 alone (locked) and four 5s; rank 1: a 5 and a 49, cap 50. By load,
    # rank 0's locked bin met rank 1's roomy bin (a pair that cannot move) and its 5s the 49's
    # bin, with room 1: nothing moved, 80 against 54. Open bins pair with open bins: three 5s
    # move, 65 against 69, the best split ({60, 5} and {49, 5, 5, 5, 5}).
    sizes = np.array([60, 5, 5, 5, 5, 5, 49])
    bin_of = np.array([0, 1, 1, 1, 1, 2, 3])
    fixed = np.array([True] + [False] * 6)
    even_groups(bin_of, sizes, sizes, 2, 50, 0.0025, Work(10**6), fixed)
    assert _loads(bin_of // 2, sizes, 2) == [65, 69]


def test_even_groups_gives_a_group_pairs_open_bins_half_its_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cap 50, three bins a rank. Rank 0: two over-cap 60s alone (locked) and fifty 1s (170);
    # rank 1: three 10s (30). The goal is 121 (the locked 120 and one 1). The one open pair
    # of bins may move half the gap: 40 of the 1s in the first pass (the light bin's room),
    # 9 in the second, 121 against 79. With 1/(2k) of the gap a bin pair, as where no bin is
    # locked, it moved 23, 15, 10 and 1 in four passes.
    sizes = np.concatenate(([60, 60], np.ones(50, dtype=np.int64), [10, 10, 10]))
    bin_of = np.concatenate(([0, 1], np.full(50, 2), [3, 4, 5]))
    fixed = np.arange(sizes.size) < 2
    moved = []

    def spy(*args: object, **kwargs: object) -> object:
        ex = bulk_moves(*args, **kwargs)
        moved.append(ex.give.size)
        return ex

    monkeypatch.setattr("slime_hydra.partition.ranks.bulk_moves", spy)
    even_groups(bin_of, sizes, sizes, 2, 50, 0.0025, Work(10**6), fixed)
    assert moved == [40, 9]
    assert _loads(bin_of // 3, sizes, 2) == [121, 79]


def test_even_groups_pairs_the_lighter_groups_roomiest_bins_with_bins_that_can_give():
    # Rank 0: [10] and [4, 4] (18); rank 1: [9] and [2, 1] (12); no bin may pass 10, the
    # heaviest. By load, rank 0's [10], which cannot give its one item, meets rank 1's roomy
    # [2, 1], and [4, 4] the full [9]: no move or swap within those pairs lowers the 18. With
    # the givers first, [4, 4] meets [2, 1] and swaps a 4 for the 1, half the gap.
    w = np.array([10, 4, 4, 9, 2, 1])
    start = np.array([0, 1, 1, 2, 3, 3])
    bin_of = start.copy()
    assert even_groups(bin_of, w, w, 2, 100, 0.0, Work(10**6)) == 18 / 15
    assert _loads(bin_of // 2, w, 2) == [18, 12]
    bin_of = start.copy()
    assert even_groups(bin_of, w, w, 2, 100, 0.0, Work(10**6), givers_first=True) == 1.0
    assert _loads(bin_of, w, 4) == [10, 5, 9, 6]


@pytest.mark.parametrize("seed", [4, 10])
def test_a_rank_of_one_large_sample_a_micro_batch_sheds_its_small_ones(seed):
    # 768 samples just over half the cap beside small ones on dp48 (pp4 vpp2 g8: K = 8, two
    # samples a micro-batch): ranks holding six large samples stopped 1.0498 and 1.0603 over
    # the mean where their micro-batches of one sample took the lighter ranks' roomiest; the
    # evening that goes on with the givers first ends within 0.5%.
    lengths = lengths_of("over_half", np.random.default_rng(seed), 768, 32768).tolist()
    layout = ParallelLayout(dp=48, pp=4, vpp=2, cp=2, microbatch_group_size_per_vp_stage=8)
    step = DynamicBatching(layout, None, 16384).plan(lengths, list(range(768))).steps[0]
    loads = [sum(lengths[i] for mb in rank for i in mb) for rank in step.ranks]
    assert max(loads) <= 1.005 * sum(lengths) / 48


def test_even_groups_spends_nothing_where_whole_items_already_set_the_heaviest_group():
    # Seven items of 10 on three ranks of one bin each: some rank holds three (30), above the
    # mean of 23.3 and its tolerance, but at the proven bound on the heaviest of three parts.
    # Moving an item only moves the 30 (it spent 20,034 visits on passes that could not help).
    sizes = np.full(7, 10)
    bin_of = np.array([0, 0, 0, 1, 1, 2, 2])
    work = Work(10**6)
    even_groups(bin_of, sizes, sizes, 3, 100, 0.0025, work)
    assert bin_of.tolist() == [0, 0, 0, 1, 1, 2, 2] and work.spent == 0


def test_evening_groups_that_cannot_reach_their_goal_stops_after_a_pass_not_its_budget():
    # Group 0's one bin holds 1,000 items of 1; groups 1-10 one item of 50 each, under a cap of
    # 51: the goal (the mean, 136, and the tolerance) is out of reach, as each light bin can
    # take one item. The first pass moves one item; at that rate the budget cannot remove the
    # excess of 864, so it stops there (it spent 213,255 visits on ten passes before, for 990).
    sizes = np.concatenate((np.ones(1000, dtype=np.int64), np.full(10, 50)))
    bin_of = np.concatenate((np.zeros(1000, dtype=np.int64), np.arange(1, 11)))
    work = Work(10**6)
    even_groups(bin_of, sizes, sizes, 11, 51, 0.0025, work)
    assert np.bincount(bin_of, weights=sizes).tolist() == [999] + [51] + [50] * 9
    assert work.spent < 10**4


def test_first_fit_decreasings_packing_cut_to_the_bound_is_repaired_where_largest_fit_is_not(
    monkeypatch,
):
    # 59 tokens under a cap of 20 need 3 bins. FFD takes 4: {10, 9}, {9, 8}, {7, 6, 6}, {4}.
    # Largest fit in rounds into 3 leaves a 6 that fits nowhere, and no exchange repairs it.
    # FFD's {4} dealt to {9, 8} (21) is repaired: {10, 9}, {9, 7, 4}, {8, 6, 6}.
    built = []

    def counted(sizes, bins, cap):
        built.append(bins)
        return fit_rounds(sizes, bins, cap)

    repaired = []

    def whole_step(bin_of, sizes, bins, cap, work):
        repaired.append(sorted(_loads(bin_of, sizes, bins)))
        return repair(bin_of, sizes, bins, cap, work)

    monkeypatch.setattr(balanced, "fit_rounds", counted)
    monkeypatch.setattr(balanced, "repair", whole_step)
    s = np.array([10, 9, 9, 8, 7, 6, 6, 4])
    found = BalancedPacker()(s, s, [3], 20, Work(100_000))
    assert found is not None
    bins, bin_of = found
    assert bins == 3 and max(_loads(bin_of, s, 3)) <= 20
    # Largest fit is built once, to be checked (at 1M samples, 90 ms each); the cut is
    # repaired first and packs, so largest fit is never repaired.
    assert built == [3]
    assert repaired == [[19, 19, 21]]


@pytest.mark.parametrize("cap", [100, 17])
def test_the_heaviest_bin_widens_its_search_until_it_meets_the_bin_that_takes_from_it(cap):
    # {6, 6, 6} = 18 over a goal of 17; forty bins {8, 8} (16) cannot take from it (a move
    # shifts 6 > the gap of 2, a swap of 6 for 8 shifts -2), only the last bin, {5, 11}, can:
    # 6 for 5 leaves 17 and 17. Four partners a pass would need ten passes to meet it; doubling
    # them after each pass in vain meets it in the fourth, within six passes' work. Under a
    # cap of 17 it is a repair, which widens likewise after a pass that exchanged nothing.
    w = np.array([6, 6, 6] + [8] * 80 + [5, 11])
    bin_of = np.array([0, 0, 0] + [1 + i // 2 for i in range(80)] + [41, 41])
    work = Work(6 * PASS_OVERHEAD + 600)
    assert improve(bin_of, w, w, 42, cap, 17, work)
    assert max(_loads(bin_of, w, 42)) == 17


def test_balancing_stalled_over_the_tolerance_is_packed_again_under_it(monkeypatch):
    # 237 truncated samples (a spike at 5,966 tokens, 3 a micro-batch) in 79 micro-batches:
    # the exchanges and MULTIFIT stop 1.26% over the proven bound; the refit, the whole-step
    # repair under 1.01 × the bound, packs within it.
    sizes = lengths_of("truncated", np.random.default_rng([38, 1]), 237, 16384)
    bound = max_part_lower_bound(sizes, 79)

    def top() -> int:
        found = BalancedPacker()(sizes, sizes, [79], 16384, Work(75_000 + 20 * 237))
        assert found is not None and found[0] == 79
        assert (np.bincount(found[1], minlength=79) > 0).all()
        return int(np.bincount(found[1], weights=sizes, minlength=79).max())

    assert top() <= 1.01 * bound
    # A call with no balancing budget (count=fastest's candidate counts) gets no refit either.
    alone = BalancedPacker()(sizes, sizes, [79], 16384, Work(0))
    assert alone is not None
    assert np.bincount(alone[1], weights=sizes, minlength=79).max() > 1.01 * bound
    monkeypatch.setattr(BalancedPacker, "_refit", lambda self, sizes, bin_of, bins, work: bin_of)
    assert top() > 1.012 * bound


def test_the_refit_packs_under_the_tolerance_of_the_bound_itself(monkeypatch):
    # 300 truncated samples in 100 micro-batches under 8,192: balancing ends over 1% of the
    # proven bound, and the refit packs under 1.01 x the bound. Under 1.01 x the lower end of
    # a bisection stopped within a quarter of the tolerance (a bound up to 0.25% weaker, as
    # the refit took it before) its repair does not pack, and the plan stays 2.1% over.
    sizes = lengths_of("truncated", np.random.default_rng([103]), 300, 8192)
    bound = max_part_lower_bound(sizes, 100)

    def top() -> float:
        found = BalancedPacker()(sizes, sizes, [100], 8192, Work(100_000 + 20 * 300))
        assert found is not None and found[0] == 100
        return np.bincount(found[1], weights=sizes, minlength=100).max() / bound

    assert top() <= 1.01

    def looser(weights, parts, upper=None, rel_tol=0.0):
        return max_part_lower_bound(weights, parts, upper=upper, rel_tol=rel_tol or 0.0025)

    monkeypatch.setattr(balanced, "max_part_lower_bound", looser)
    assert top() > 1.02


def test_a_refit_after_a_count_search_that_spent_its_budget_has_a_budget_of_its_own():
    # 600 truncated samples on dp3 under a cap of 4,096: the count search cannot pack K_lb (57)
    # and spends the repairs' budget; at 58 the balancing ends 1.57% over the bound, which the
    # refit, with a budget of its own, packs within 1% (with what the search left: 1.0157).
    lengths = lengths_of("truncated", np.random.default_rng([24]), 600, 4096)
    layout = ParallelLayout(dp=3)
    assert microbatch_lower_bound(lengths, 4096, 3, 1) == 57
    m = _planned(lengths.tolist(), layout, 4096)
    assert m["batch/num_microbatches"] == 58
    assert m["batch/mb_tokens_max"] <= 1.01 * m["batch/mb_tokens_lb"]


def test_a_plan_just_over_the_tolerance_is_repaired_as_it_is_in_a_few_passes(monkeypatch):
    # 4,096 truncated samples in 992 micro-batches (dp32, K_lb 31): balancing ends 1.09% over
    # the bound; repairing that plan to 1% packs within NEAR_PASSES passes, where the refit
    # from largest fit took 439k visits. (Packed whole: through its heads, grouped from 2,048
    # samples, balancing ends within 1%.)
    sizes = lengths_of("truncated", np.random.default_rng([1408947130, 3, 4096]), 4096, 16384)
    packer = BalancedPacker(group_items=0)
    with monkeypatch.context() as m:
        m.setattr(BalancedPacker, "_refit", lambda self, sizes, bin_of, bins, work: bin_of)
        found = packer(sizes, sizes, [992], 16384, Work(75_000 + 20 * 4096))
    assert found is not None
    bound = max_part_lower_bound(sizes, 992)
    assert np.bincount(found[1], weights=sizes, minlength=992).max() > 1.01 * bound
    work = Work(10**6)
    refit = packer._refit(sizes, found[1], 992, work)
    assert np.bincount(refit, weights=sizes, minlength=992).max() <= 1.01 * bound
    assert work.spent <= balanced.NEAR_PASSES * (4096 + PASS_OVERHEAD)


def test_a_refit_packs_under_first_fit_decreasing_where_the_repairs_miss_the_pairs():
    # bench_planner case 1854103313:31, its second step: 648 truncated samples in 480
    # micro-batches (dp12, K = K_lb = 40) under 4,096, most alone, the others in pairs. The
    # balancing ends 2.68% over the bound and the repairs under 1.01 x it stall; FFD under it
    # packs 480 bins.
    case = draw_case("1854103313:31", "truncated")
    lengths = case.lengths[648:1296]
    m = _planned(lengths, case.layout, 4096)
    assert m["batch/num_microbatches"] == 40
    assert m["batch/mb_tokens_max"] <= 1.01 * m["batch/mb_tokens_lb"]


def test_a_refit_packs_first_fit_decreasings_cut_where_largest_fits_repair_fails():
    # 4,096 GRPO samples on dp32 (the seed sweep's draw 5 of seed 1854103313): the count
    # search cannot pack K_lb = 41 and the plan is FFD's packing at 42; balancing ends 1.81%
    # over the bound (the largest sample) and largest fit in rounds under 1.01 x it does not
    # repair; FFD's packing under it, 1,349 bins cut to 1,344, does.
    lengths = lengths_of("grpo", np.random.default_rng([1854103313, 5, 4096]), 4096, 16384)
    layout = ParallelLayout(dp=32)
    m = _planned(lengths.tolist(), layout, 16384)
    assert m["batch/num_microbatches_lb"] == 41 and m["batch/num_microbatches"] == 42
    assert m["batch/mb_tokens_max"] <= 1.01 * m["batch/mb_tokens_lb"]


def test_a_refits_repairs_leave_first_fit_decreasing_under_the_tolerance_its_price():
    # 400 truncated samples on dp8 under 4,096 (K = K_lb = 36): balancing ends 2.7% over the
    # bound, 3,831. Largest fit's repair under 1.01 x it (3,869) fails having spent what it
    # was given; given all of the refit's 140k visits, it left too little for FFD under it
    # (9k: VISITS_PER_ITEM a sample and a pass), which packs 288 bins.
    lengths = lengths_of("truncated", np.random.default_rng(42), 400, 4096).tolist()
    m = _planned(lengths, ParallelLayout(dp=8), 4096)
    assert m["batch/num_microbatches"] == 36 and m["batch/mb_tokens_lb"] == 3831
    assert m["batch/mb_tokens_max"] <= 1.01 * m["batch/mb_tokens_lb"]


def test_the_refits_budget_pays_first_fit_decreasing_under_the_tolerance_beside_the_repairs():
    # 400 samples: the step's 100,000 and 100 a sample for the repairs, as the count search
    # gets, and one FFD (10 a sample and a pass, 5,000) that they leave: taken out of the
    # repairs instead, largest fit's repair of a GRPO step of 3,373 samples on dp64 missed
    # 1.01 of the bound (1.0341) by the 38,730 visits it lost.
    assert BalancedPacker()._repairs(400).budget == 140_000
    assert BalancedPacker()._repairs(400, packings=1).budget == 149_000


def test_a_refit_that_packs_nothing_under_the_tolerance_lowers_the_plan_by_multifit():
    # 400 truncated samples on dp8 under 4,096 (K = K_lb = 38), one or two a micro-batch:
    # balancing ends 3.76% over the bound (4,000 against 3,855) and no start packs under 1.01
    # x it; FFD under the least limit MULTIFIT's bisection finds below the plan's top, with
    # what the repairs left, ends 1.32% over (3,906).
    lengths = lengths_of("truncated", np.random.default_rng(381), 400, 4096).tolist()
    m = _planned(lengths, ParallelLayout(dp=8), 4096)
    assert m["batch/num_microbatches"] == m["batch/num_microbatches_lb"]
    assert m["batch/mb_tokens_max"] <= 1.02 * m["batch/mb_tokens_lb"]


@st.composite
def crowded_cases(draw: st.DrawFn):
    """Steps of 2-6 samples a bin, where single exchanges stall over the tolerance."""
    family = draw(st.sampled_from(["truncated", "third", "grpo", "pareto"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    sizes = lengths_of(family, rng, draw(st.integers(20, 400)), 16384)
    bins = max(1, int(len(sizes) / draw(st.floats(2.0, 6.0))))
    return sizes, bins


@PROPERTY
@given(crowded_cases(), st.integers(0, 200_000))
def test_a_refit_lowers_the_heaviest_bin_within_its_budget_or_leaves_the_packing(case, budget):
    # To the tolerance where a start packs under it; else as far as MULTIFIT's bisection goes.
    sizes, bins = case
    packer = BalancedPacker()
    found = BalancedPacker(budget=0, budget_per_sample=0)(sizes, sizes, [bins], 16384, Work(0))
    assume(found is not None)
    bin_of = found[1]
    before = bin_of.copy()
    work = Work(budget)
    refit = packer._refit(sizes, bin_of, bins, work)
    assert work.spent <= budget
    assert np.array_equal(bin_of, before)  # the packing it was given is left as it was
    if refit is bin_of:
        return
    counts = np.bincount(refit, minlength=bins)
    assert len(counts) == bins and (counts > 0).all()
    top = np.bincount(refit, weights=sizes, minlength=bins).max()
    assert top < np.bincount(before, weights=sizes, minlength=bins).max()


def test_largest_fit_deals_the_largest_items_to_the_roomiest_bins_while_all_fit_anywhere():
    # Rooms 10, 8, 9 and items 1, 1, 2, 2, 3: every room holds the largest item, so the roomiest
    # bin takes the 3, the next two the 2s (the later one first); rooms 7, 6, 7. Then bin 0 and
    # bin 2 (equal rooms: by index) take the 1s, the later one first.
    room = np.array([10, 8, 9])
    assert largest_fit(np.array([1, 1, 2, 2, 3]), room).tolist() == [2, 0, 1, 2, 0]
    assert room.tolist() == [6, 6, 6]


def test_largest_fit_gives_each_bin_the_largest_item_that_fits_and_no_roomier_bin_took():
    # Rooms 10 and 6, items 1, 2, 3, 4, 5, 9: bin 0 takes the 9, bin 1 the 5 (rooms 1, 1); then
    # bin 0 takes the 1 and bin 1 nothing, and no room holds a 2.
    room = np.array([10, 6])
    assert largest_fit(np.array([1, 2, 3, 4, 5, 9]), room).tolist() == [0, -1, -1, -1, 1, 0]
    assert room.tolist() == [0, 1]


def _largest_fit_by_hand(vals: list[int], room: list[int]) -> tuple[list[int], list[int]]:
    """largest_fit's rule item by item: in rounds, each bin, roomiest first (ties by bin),
    takes the largest item left (ties: the later) that fits, until no bin takes one."""
    got, left, room = [-1] * len(vals), list(range(len(vals))), list(room)
    while True:
        took = False
        for b in sorted(range(len(room)), key=lambda b: (-room[b], b)):
            fits = [i for i in left if vals[i] <= room[b]]
            if fits:
                got[fits[-1]], took = b, True
                room[b] -= vals[fits[-1]]
                left.remove(fits[-1])
        if not took:
            return got, room


@PROPERTY
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=60),
    st.lists(st.integers(0, 120), min_size=1, max_size=8),
)
def test_largest_fit_is_its_rule_item_by_item(vals, rooms):
    vals = sorted(vals)
    room = np.array(rooms)
    got = largest_fit(np.array(vals), room)
    assert (got.tolist(), room.tolist()) == _largest_fit_by_hand(vals, rooms)
