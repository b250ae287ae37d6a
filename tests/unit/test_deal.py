"""partition.deal: the heaviest-first order and the even split of items over groups."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_hydra.partition.deal import (
    ascending,
    ascending_by,
    count_at_most,
    descending,
    run_starts,
    sort_values,
    split_even,
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_run_starts_marks_where_each_run_of_equal_values_starts():
    assert run_starts(np.array([4, 4, 2, 7, 7, 7, 4])).tolist() == [1, 0, 1, 1, 0, 0, 1]
    assert run_starts(np.array([9])).tolist() == [True]
    assert run_starts(np.zeros(0, dtype=np.int64)).size == 0


def test_descending_breaks_ties_by_index():
    assert descending(np.array([3, 5, 3, 5, 1])).tolist() == [1, 3, 0, 2, 4]


def test_count_at_most_counts_the_values_at_or_below_each_key():
    # 3, 5, 5, 9 (a span of 6, by the table where there are 6 keys or more): below the
    # smallest 0, at a repeated value both, above the largest all.
    values = np.array([3, 5, 5, 9])
    keys = np.array([2, 3, 4, 5, 8, 9, 40])
    assert count_at_most(values, keys).tolist() == [0, 1, 1, 3, 3, 4, 4]
    assert count_at_most(values, keys[:2]).tolist() == [0, 1]  # searchsorted: 2 keys < span
    assert count_at_most(np.zeros(0, dtype=np.int64), keys[:2]).tolist() == [0, 0]


def test_ascending_by_sorts_by_the_first_key_then_the_second_then_the_index():
    # (major, minor): (1, 0) (0, 2) (1, 0) (0, 1) (0, 2): by major 3, 1, 4 then 0, 2; by minor
    # within major 0: 3 (1) before 1 and 4 (2), those by index.
    major, minor = np.array([1, 0, 1, 0, 0]), np.array([0, 2, 0, 1, 2])
    assert ascending_by(major, minor).tolist() == [3, 1, 4, 0, 2]


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 1 << 31)), max_size=80))
def test_ascending_by_is_a_lexsort_of_both_keys_and_the_index(pairs):
    major = np.array([a for a, _ in pairs], dtype=np.int64)
    minor = np.array([b for _, b in pairs], dtype=np.int64)
    expected = np.lexsort((np.arange(len(pairs)), minor, major))
    assert ascending_by(major, minor).tolist() == expected.tolist()


@PROPERTY
@given(
    st.lists(st.integers(-50, 200), max_size=60),
    st.lists(st.integers(-100, 300), min_size=1, max_size=300),
)
def test_count_at_most_is_searchsorteds_right_side(values, keys):
    v, k = np.sort(np.array(values, dtype=np.int64)), np.array(keys, dtype=np.int64)
    assert count_at_most(v, k).tolist() == np.searchsorted(v, k, side="right").tolist()


def test_ascending_breaks_ties_by_index_across_the_radix_span():
    # 70,000 - 1 spans more than 16 bits: the plain stable sort; 65,536 + 4 - 4 does not.
    assert ascending(np.array([9, 70_000, 9, 1, 70_000])).tolist() == [3, 0, 2, 1, 4]
    assert ascending(np.array([65_539, 4, 65_539, 4])).tolist() == [1, 3, 0, 2]
    assert descending(np.array([65_539, 4, 65_539, 4])).tolist() == [0, 2, 1, 3]
    assert sort_values(np.array([65_539, 4, 65_539, 4])).tolist() == [4, 4, 65_539, 65_539]
    assert sort_values(np.array([70_000, -2, 9])).tolist() == [-2, 9, 70_000]
    # Two 16-bit passes up to a span of 2^32 - 1 (the high halves 0, 1 and 65,535 here), the
    # plain stable sort from 2^32.
    top = (1 << 32) - 1
    assert ascending(np.array([top, 65_537, 5, top, 65_536, 5])).tolist() == [2, 5, 4, 1, 0, 3]
    assert descending(np.array([top, 65_537, 5, top, 65_536, 5])).tolist() == [0, 3, 1, 4, 2, 5]
    assert ascending(np.array([1 << 32, 7, 0, 7])).tolist() == [2, 1, 3, 0]


@PROPERTY
@given(
    st.lists(st.integers(-5, 5), min_size=1, max_size=300),
    st.sampled_from([1, 1000, 1 << 15, 1 << 16, 1 << 28, 1 << 29, 1 << 40]),
    st.integers(-(1 << 20), 1 << 20),
)
def test_the_orders_are_the_stable_sorts_whatever_the_span(steps, scale, offset):
    # Values spread over spans below 16 bits, below 32 and above, negative ones too: the 16-bit
    # radix passes must give the same orders as a stable sort of the values themselves.
    v = np.array(steps, dtype=np.int64) * scale + offset
    assert ascending(v).tolist() == np.argsort(v, kind="stable").tolist()
    assert descending(v).tolist() == np.lexsort((np.arange(v.size), -v)).tolist()
    assert sort_values(v).tolist() == sorted(v.tolist())


@PROPERTY
@given(st.lists(st.integers(1, 20_000), min_size=1, max_size=600), st.integers(1, 40))
def test_split_even_places_each_item_once_with_equal_counts_and_long_items_spread(weights, groups):
    w = np.array(weights, dtype=np.int64)
    cols = split_even(w, groups, 0.0)
    assert cols.shape == (-(-len(weights) // groups), groups)
    placed = cols[cols >= 0]
    assert sorted(placed.tolist()) == list(range(len(weights)))
    counts = (cols >= 0).sum(0)
    assert counts.max() - counts.min() <= 1
    # Every column heaviest first, and any "long" threshold is shared out within one item.
    for col in cols.T:
        col_w = w[col[col >= 0]]
        assert (np.diff(col_w) <= 0).all()
    for threshold in (np.median(w), np.percentile(w, 90)):
        long = ((cols >= 0) & (w[np.maximum(cols, 0)] > threshold)).sum(0)
        assert long.max() - long.min() <= 1


def test_split_even_evens_the_totals():
    rng = np.random.default_rng(0)
    w = rng.integers(300, 16_000, 4096)
    cols = split_even(w, 32, 0.0)
    totals = np.array([w[c[c >= 0]].sum() for c in cols.T])
    assert totals.max() * 32 / totals.sum() < 1.001
