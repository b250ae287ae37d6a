"""partition.multifit: first-fit decreasing under a load limit, by hand and as properties, and
the packer's use of it where exchanges stall above the bound."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_hydra.partition import BalancedPacker, Work
from slime_hydra.partition.base import PASS_OVERHEAD
from slime_hydra.partition.multifit import VISITS_PER_ITEM, ffd_within, fill_empty, multifit

SIZES = np.array([7, 6, 5, 4, 3, 3])
ONE_PACKING = VISITS_PER_ITEM * SIZES.size + PASS_OVERHEAD


def _loads(bin_of: np.ndarray, w: np.ndarray, bins: int) -> list[int]:
    return np.bincount(bin_of, weights=w, minlength=bins).astype(int).tolist()


def test_ffd_within_packs_under_the_limit_where_it_needs_no_more_bins():
    # Two bins of SIZES (bound 14). FFD under 16: {7, 6, 3}, {5, 4, 3}; under 15: {7, 6},
    # {5, 4, 3, 3}. One packing each.
    for limit, loads in ((16, [16, 12]), (15, [13, 15])):
        work = Work(10**6)
        bin_of = ffd_within(SIZES, 2, limit, work)
        assert bin_of is not None and _loads(bin_of, SIZES, 2) == loads
        assert work.spent == ONE_PACKING


def test_ffd_within_tries_its_one_limit_only_and_pays_for_what_it_placed():
    # Under 14 FFD needs three bins: {7, 6}, {5, 4, 3}, {3} (the optimum, {7, 4, 3} and
    # {6, 5, 3}, is one FFD does not find). No limit above it is tried, and it stops once {7, 6}
    # leaves 1 of room where two bins of 14 may leave none: two items' work.
    work = Work(10**6)
    assert ffd_within(SIZES, 2, 14, work) is None
    assert work.spent == 2 * VISITS_PER_ITEM + PASS_OVERHEAD


def test_ffd_within_starts_no_packing_the_work_cannot_pay_for():
    work = Work(ONE_PACKING - 1)
    assert ffd_within(SIZES, 2, 16, work) is None
    assert work.spent == 0


def test_work_affords_a_pass_only_within_what_is_left_and_charges_nothing():
    work = Work(PASS_OVERHEAD + 10, spent=5)
    assert work.affords(5) and not work.affords(6)
    assert not work.affords(0, passes=2)
    assert work.spent == 5


def test_a_part_of_the_work_spends_at_most_its_share_of_what_is_left_and_charges_it_back():
    work = Work(100, spent=30)
    with work.part(50) as part:
        assert (part.budget, part.spent) == (80, 30)
        part.spent += 20
    assert work.spent == 50
    with work.part(1_000) as part:  # no more than is left
        assert part.budget == 100
    with work.part(-5) as part:  # a share below nothing is nothing
        assert part.budget == 50 and not part.left
    assert work.spent == 50


def test_multifit_bisects_to_the_least_limit_first_fit_decreasing_packs_while_work_pays():
    # 22 tokens in two bins. FFD under 10 needs three; under 13 it packs {6, 5, 2} and
    # {4, 3, 2}, under 11 {6, 5} and {4, 3, 2, 2}: the bisection of (10, 16) probes 13 and 11.
    sizes = np.array([6, 5, 4, 3, 2, 2])
    probe = VISITS_PER_ITEM * 6 + PASS_OVERHEAD
    work = Work(10**6)
    assert _loads(multifit(sizes, 2, 10, 16, work), sizes, 2) == [11, 11]
    assert work.spent == 2 * probe
    one = Work(probe)  # pays for the first probe only
    assert _loads(multifit(sizes, 2, 10, 16, one), sizes, 2) == [13, 9]
    assert multifit(sizes, 2, 10, 16, Work(probe - 1)) is None
    assert multifit(sizes, 2, 10, 11, Work(10**6)) is None  # no limit between


def test_fill_empty_gives_each_empty_bin_one_item_from_a_bin_of_two_or_more():
    w = np.array([5, 1, 1, 1])
    bin_of = np.zeros(4, dtype=np.int64)  # everything in bin 0, as FFD under 8 packs it
    fill_empty(bin_of, w, 3)
    assert _loads(bin_of, w, 3) == [6, 1, 1]


def test_the_packer_reaches_the_optimum_where_exchanges_alone_stop_above_it():
    # 157 tokens in two bins: the bound is 79 and {62, 17}, {51, 12, 8, 7} reaches it. The
    # exchanges stop at {62, 8, 7} = 77 and {51, 17, 12} = 80: no move or swap of one item
    # lowers the 80 without raising the other bin above it. FFD under 79 opens with 62, takes
    # 17, and packs the rest into the second bin.
    s = np.array([51, 62, 17, 7, 8, 12])
    bins, bin_of = BalancedPacker()(s, s, [2], 200, Work(100_000))
    assert bins == 2 and sorted(_loads(bin_of, s, 2)) == [78, 79]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 60), min_size=2, max_size=40),
    st.integers(1, 8),
    st.integers(0, 60),
    st.integers(0, 2 * ONE_PACKING),
)
def test_ffd_within_returns_non_empty_bins_under_its_limit_within_its_work(
    sizes, bins, above, budget
):
    s = np.asarray(sizes, dtype=np.int64)
    bins = min(bins, s.size)
    limit = max(int(s.max()), -(-int(s.sum()) // bins)) + above
    work = Work(budget)
    bin_of = ffd_within(s, bins, limit, work)
    assert work.spent <= budget
    if bin_of is not None:
        loads = np.bincount(bin_of, weights=s, minlength=bins)
        assert bin_of.min() >= 0 and bin_of.max() < bins
        assert (np.bincount(bin_of, minlength=bins) > 0).all()
        assert loads.max() <= limit
    # Everything in one bin packs under the total: FFD finds it wherever work pays for it.
    if budget >= VISITS_PER_ITEM * s.size + PASS_OVERHEAD:
        assert ffd_within(s, 1, int(s.sum()), Work(budget)) is not None
