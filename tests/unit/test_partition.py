"""Partition library: every item placed once, parts non-empty and within the cap, near the bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_hydra.partition import (
    PartitionError,
    align_up,
    capped_partition,
    first_fit,
    karmarkar_karp,
    lpt,
    min_bins_lower_bound,
    part_sums,
)

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
def test_karmarkar_karp_and_lpt_are_within_the_greedy_bound(weights, k):
    # Any list-scheduling-quality partition has max part <= mean + max item.
    for parts in (karmarkar_karp(weights, k), lpt(weights, k)):
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


@settings(max_examples=300)
@given(
    weights_st,
    st.integers(5000, 20_000),
    st.integers(1, 8),
    st.integers(0, 7),
    st.integers(1, 40),
)
def test_capped_partition_invariants(weights, cap, align, offset, min_parts):
    try:
        parts = capped_partition(weights, cap, align=align, offset=offset, min_parts=min_parts)
    except PartitionError:
        # Only acceptable when even the smallest admissible count exceeds the items.
        k0 = align_up(max(min_parts, min_bins_lower_bound(weights, cap)), align, offset)
        assert k0 > len(weights) or k0 + align > len(weights)
        return
    k = len(parts)
    assert _is_partition(parts, len(weights))
    assert all(parts), "no empty part"
    assert max(part_sums(parts, weights)) <= cap
    assert k >= min_parts and (k + offset) % align == 0
    assert k >= min_bins_lower_bound(weights, cap)


@given(weights_st, st.integers(5000, 20_000))
def test_capped_partition_never_needs_more_parts_than_first_fit(weights, cap):
    ff = len(first_fit(weights, cap))
    assert len(capped_partition(weights, cap)) <= ff


def test_capped_partition_items_exactly_at_the_cap():
    parts = capped_partition([100, 100, 100], 100)
    assert sorted(map(tuple, parts)) == [(0,), (1,), (2,)]


def test_capped_partition_rejects_an_item_over_the_cap():
    with pytest.raises(PartitionError, match="exceeds the cap"):
        capped_partition([10, 101], 100)


def test_capped_partition_more_parts_than_items_is_an_error():
    with pytest.raises(PartitionError, match="cannot fill"):
        capped_partition([1, 1, 1], 100, min_parts=4)


def test_capped_partition_is_flat_when_items_are_many():
    weights = [(i * 7919) % 3000 + 50 for i in range(2000)]
    parts = capped_partition(weights, 10**9, min_parts=32)
    bound = max(max(weights), sum(weights) / 32)
    assert max(part_sums(parts, weights)) <= 1.01 * bound


def test_capped_partition_finds_a_tight_packing_lpt_misses():
    # LPT into 2 parts gives {7,3,2} and {5,4,...}: needs the local search or FFD to fit cap 10.
    weights = [7, 5, 4, 3, 1]
    parts = capped_partition(weights, 10)
    assert len(parts) == 2
    assert max(part_sums(parts, weights)) <= 10


def test_capped_partition_balances_weights_under_a_cap_on_sizes():
    # Tokens [6, 3, 3, 2, 2, 2] under cap 10 need 2 parts. By tokens the best is 9 + 9
    # ({6, 3} and {3, 2, 2, 2}), whose FLOPs (L²) are 45 and 21. By FLOPs the 6 cannot sit
    # alone (the other 12 tokens would break the cap), so its lightest partner set is one 2:
    # {6, 2} = 40 and {3, 3, 2, 2} = 26 (10 tokens, at the cap).
    sizes = [6, 3, 3, 2, 2, 2]
    flops = [n * n for n in sizes]
    parts = capped_partition(flops, 10, sizes=sizes)
    assert len(parts) == 2
    assert max(part_sums(parts, flops)) == 40
    assert max(part_sums(parts, sizes)) <= 10


@settings(max_examples=200)
@given(st.lists(st.integers(1, 4000), min_size=1, max_size=100), st.integers(4000, 12_000))
def test_capped_partition_with_sizes_keeps_the_size_cap(sizes, cap):
    flops = [n + n * n // 64 for n in sizes]
    parts = capped_partition(flops, cap, sizes=sizes)
    assert _is_partition(parts, len(sizes))
    assert all(parts)
    assert max(part_sums(parts, sizes)) <= cap
    assert len(parts) <= len(first_fit(sizes, cap))
