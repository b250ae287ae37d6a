"""Karmarkar-Karp, first-fit and first-fit decreasing: every item placed once, by hand."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_hydra.partition import first_fit, first_fit_decreasing, karmarkar_karp, part_sums
from slime_hydra.partition.greedy import first_fit_decreasing_within

weights_st = st.lists(st.integers(1, 5000), min_size=1, max_size=120)


def _is_partition(parts: list[list[int]], n: int) -> bool:
    return sorted(i for p in parts for i in p) == list(range(n))


@given(weights_st, st.integers(1, 16), st.booleans())
def test_karmarkar_karp_places_every_item_once(weights, k, equal_size):
    parts = karmarkar_karp(weights, k, equal_size=equal_size)
    assert len(parts) == k
    assert _is_partition(parts, len(weights))
    if equal_size:
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


@given(weights_st, st.integers(1, 16))
def test_karmarkar_karp_is_within_the_greedy_bound(weights, k):
    # Any list-scheduling-quality partition has max part <= mean + max item.
    parts = karmarkar_karp(weights, k)
    assert max(part_sums(parts, weights)) <= sum(weights) / k + max(weights)


def test_karmarkar_karp_hand_case():
    # {8,7,6,5,4} into 2: KK differencing gives 8,7,6,5,4 -> 16 vs 14.
    parts = karmarkar_karp([8, 7, 6, 5, 4], 2)
    assert sorted(part_sums(parts, [8, 7, 6, 5, 4])) == [14, 16]


@given(weights_st, st.integers(1, 10_000))
def test_first_fit_respects_the_cap_in_order(weights, cap):
    parts = first_fit(weights, cap)
    assert _is_partition(parts, len(weights))
    for p in parts:
        assert sum(weights[i] for i in p) <= cap or len(p) == 1
        assert p == sorted(p)  # items enter bins in input order


def test_first_fit_with_max_bins_reports_no_fit():
    assert first_fit([6, 6, 6], 10, max_bins=2) is None
    assert first_fit([6, 4, 6, 4], 10, max_bins=2) == [[0, 1], [2, 3]]


def test_first_fit_decreasing_by_hand():
    # 7 opens bin 0 and takes the 3 (largest that fits); 6 opens bin 1 with the 4; 5 alone.
    assert first_fit_decreasing(np.array([3, 7, 5, 4, 6]), 10).tolist() == [0, 0, 2, 1, 1]


def test_first_fit_decreasing_repeats_a_bin_while_its_sizes_last():
    # Bin 0 is {6, 4} (the 6 and the 4 of highest index); bins 1 and 2 repeat it from the
    # items left; then the 3s: {3, 3, 3} and {3}.
    sizes = np.array([6, 6, 6, 4, 4, 4, 3, 3, 3, 3])
    assert first_fit_decreasing(sizes, 10).tolist() == [2, 1, 0, 2, 1, 0, 4, 3, 3, 3]


def test_first_fit_decreasing_takes_a_size_as_often_as_it_fits_at_once():
    # Bin 0: the 8, a 3 (of highest index), a 1 (the same). Bin 1: the other two 3s leave 6,
    # which six of the seven 1s left fill, the highest first; the last 1 opens bin 2.
    sizes = np.array([8, 3, 3, 3, *[1] * 8])
    assert first_fit_decreasing(sizes, 12).tolist() == [0, 1, 1, 0, 2, *[1] * 6, 0]


def test_first_fit_decreasing_within_stops_once_its_closed_bins_leave_too_much_room():
    sizes = np.array([7, 6, 5, 4, 3, 3])  # 28 in all
    # Under 15, two bins: {7, 6}, {5, 4, 3, 3}, every item placed.
    packed, placed = first_fit_decreasing_within(sizes, 15, 2)
    assert packed is not None and packed.tolist() == [0, 0, 1, 1, 1, 1] and placed == 6
    # Under 14 two bins may leave no room; {7, 6} leaves 1: it stops after two items.
    assert first_fit_decreasing_within(sizes, 14, 2) == (None, 2)


def test_first_fit_decreasing_within_counts_a_repeated_bins_room_for_each_repeat():
    # Under 11 (4 bins, 44 - 42 = 2 to leave): {6, 4} leaves 1, and the two bins that repeat
    # it leave 1 each: 3 > 2 after two items, where FFD would go on to {3, 3, 3}, {3}: 5 bins.
    sizes = np.array([6, 6, 6, 4, 4, 4, 3, 3, 3, 3])
    assert first_fit_decreasing_within(sizes, 11, 4) == (None, 2)
    assert int(first_fit_decreasing(sizes, 11).max()) + 1 == 5


def test_first_fit_decreasing_within_packs_no_items_only_into_a_count_of_bins():
    # `_pack_around` asks whether the rest packs beside its over-cap samples: where those
    # outnumber the micro-batches left, no bins are left for even an empty rest.
    assert first_fit_decreasing_within(np.zeros(0, dtype=np.int64), 10, 0)[0].size == 0
    assert first_fit_decreasing_within(np.zeros(0, dtype=np.int64), 10, -1) == (None, 0)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(1, 100), min_size=1, max_size=200),
        st.lists(st.integers(20, 45), min_size=1, max_size=300),
    ),
    st.integers(100, 250),
    st.integers(1, 40),
)
def test_first_fit_decreasing_within_is_its_packing_exactly_where_it_needs_no_more_bins(
    sizes, cap, bins
):
    s = np.asarray(sizes, dtype=np.int64)
    full = first_fit_decreasing(s, cap)
    packed, placed = first_fit_decreasing_within(s, cap, bins)
    if int(full.max()) < bins:
        assert packed is not None and packed.tolist() == full.tolist() and placed == s.size
    else:
        assert packed is None and placed < s.size


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(1, 100), min_size=1, max_size=200),
        st.lists(st.integers(20, 45), min_size=1, max_size=300),  # few sizes: bins repeat
        st.lists(st.integers(1, 6), min_size=1, max_size=300),  # many of a size a bin
    ),
    st.integers(100, 250),
)
def test_first_fit_decreasing_is_first_fit_on_the_items_heaviest_first(sizes, cap):
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], -i))
    expected = first_fit(sizes, cap, order)
    assert expected is not None
    got = first_fit_decreasing(np.asarray(sizes, dtype=np.int64), cap)
    assert sorted(
        sorted(np.flatnonzero(got == b).tolist()) for b in range(got.max() + 1)
    ) == sorted(sorted(part) for part in expected)
