"""partition.grouping: a step packed through its groups' heads, by hand and as properties over
the length families."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition import BalancedPacker, Work
from slime_hydra.partition.deal import descending
from slime_hydra.partition.grouping import Grouping
from slime_hydra.schedule import DynamicBatching, ParallelLayout
from slime_hydra.schedule.invariants import violations
from tests.families import FAMILIES, ISOLATE, lengths_of

PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_each_copy_takes_one_item_of_every_group_into_its_heads_bin():
    sizes = np.array([10, 9, 8, 7, 6, 5, 4])
    groups = Grouping(np.arange(7), copies=2)
    assert groups.heads(sizes).tolist() == [10, 8, 6, 4]
    # Heads {10, 4} and {8, 6}; copy 1 lacks the last group's item; bin 4 is no copy's and
    # takes the heaviest item that does not lead its bin (6, from bin 1).
    bin_of = groups.spread(np.array([0, 1, 1, 0]), 2, 5, sizes)
    assert bin_of.tolist() == [0, 2, 1, 3, 4, 3, 0]
    assert np.bincount(bin_of, weights=sizes).tolist() == [14, 8, 9, 12, 6]


def test_the_most_copies_that_divide_the_step_between_counts_are_taken():
    sizes = np.full(12, 10)
    # At most 12 // 2 = 6 copies; 4 divides the step of 4 bins, 6 and 5 do not.
    assert Grouping.of(sizes, [8, 12], 100, 0.01, least=2).copies == 4
    # No step of more than one count: the first count's own divisors.
    assert Grouping.of(sizes, [6], 100, 0.01, least=2).copies == 6
    assert Grouping.of(sizes, [8, 12], 100, 0.01, least=7) is None  # 12 < 2 × 7
    assert Grouping.of(sizes, [8, 12], 100, 0.01, least=0) is None


def test_the_bins_the_copies_miss_count_against_a_quarter_of_the_room_left():
    sizes = np.full(12, 10)
    # 9 bins in groups of 4 or 2 miss 1 bin. In 9 bins of 100 the 120 tokens leave 780, a
    # quarter of which (195) holds the missed bin's 100; in 9 bins of 20 they leave 60 (15).
    assert Grouping.of(sizes, [9, 13], 100, 0.01, least=2).copies == 4
    assert Grouping.of(sizes, [9, 13], 20, 0.01, least=2) is None
    # The room is the first count's that holds the tokens: 4 bins of 20 do not, 8 leave 40.
    assert Grouping.of(sizes, [4, 8, 12], 20, 0.01, least=2).copies == 4
    assert Grouping.of(sizes, [4], 20, 0.01, least=2) is None


def test_rounding_up_to_the_heads_is_limited_by_room_and_tolerance():
    sizes = np.array([9, 8, 7, 6, 5, 4, 3, 2])
    # Heads 9, 7, 5, 3 stand for 44 tokens as 48: 4 lost, a tenth of the tokens over 4
    # (tolerance/4 of 44 is 4 from a tolerance of 0.3637).
    assert Grouping.of(sizes, [6, 326], 10, 0.37, least=4).copies == 2
    assert Grouping.of(sizes, [6, 326], 10, 0.36, least=4) is None
    # 6 bins of 10 leave 16 tokens of room, and 4 lost is a quarter of them; 6 bins of 9
    # leave 10, of which 4 is more than a quarter.
    assert Grouping.of(sizes, [6, 326], 9, 0.37, least=4) is None


def test_the_heads_are_balanced_within_what_rounding_leaves_of_the_tolerance():
    groups = Grouping(np.arange(4), copies=2)
    sizes = np.array([10_000, 9_900, 9_800, 9_700])
    heads = groups.heads(sizes)  # 10,000 and 9,800: 19,800 tokens for 19,700 a copy
    # In 2 bins the step's mean bin is 19,700 and the heads' 19,800, their bound at most
    # 19,801: the heads keep 1.01 × 19,700 / 19,801 - 1 of the tolerance.
    assert groups.tolerance(sizes, heads, 2, 0.01) == pytest.approx(0.0048482, abs=1e-7)
    # A third bin, which no copy fills, lowers the step's mean bin by a third: none is left.
    assert groups.tolerance(sizes, heads, 3, 0.01) == 0.0
    assert groups.tolerance(sizes, heads, 3, 0.6) == pytest.approx(0.0612259, abs=1e-7)


def test_the_packer_packs_the_heads_and_gives_the_count_they_stand_for():
    sizes = np.full(64, 10)
    # 8 copies of 8 heads of 10 under a cap of 20: the heads need 4 bins, so 32.
    found = BalancedPacker(group_items=4)(sizes, sizes, range(16, 65, 8), 20, Work(10_000))
    assert found is not None
    bins, bin_of = found
    assert bins == 32
    assert np.bincount(bin_of, minlength=32).tolist() == [2] * 32


@st.composite
def grouped_cases(draw: st.DrawFn):
    family = draw(st.sampled_from(sorted(set(FAMILIES) - ISOLATE)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    cap = int(draw(st.sampled_from([1024, 4096, 16384])))
    sizes = lengths_of(family, rng, draw(st.integers(64, 2000)), cap)
    # Steps and first counts of many divisors, as dp·K are: most of them group.
    step = draw(st.sampled_from([1, 8, 64, 256, 1024]))
    first = max(64 * draw(st.integers(0, len(sizes) // 64)), 1)
    flops = draw(st.booleans())
    weights = sizes + sizes * sizes // 64 if flops else sizes
    return sizes, weights, range(first, len(sizes) + 1, step), cap


@PROPERTY
@given(grouped_cases(), st.integers(2, 16), st.integers(0, 400_000), st.floats(0.01, 0.9))
def test_a_grouped_packing_keeps_its_invariants_and_its_budget(case, least, budget, tolerance):
    sizes, weights, counts, cap = case
    work = Work(budget)
    # A wide tolerance lets steps this small lose what grouping costs them.
    packer = BalancedPacker(tolerance=tolerance, budget=budget, group_items=least)
    found = packer(sizes, weights, counts, cap, work)
    assert work.spent <= budget
    if found is None:
        return
    bins, bin_of = found
    assert bins in counts
    assert bin_of.shape == sizes.shape
    counted = np.bincount(bin_of, minlength=bins)
    assert len(counted) == bins and (counted > 0).all()
    loads = np.bincount(bin_of, weights=sizes, minlength=bins)
    assert ((loads <= cap) | (counted == 1)).all()


@PROPERTY
@given(
    st.sampled_from(sorted(FAMILIES)),
    st.integers(0, 2**32 - 1),
    st.integers(2, 8),
    st.integers(1, 40),
)
def test_no_copy_is_heavier_than_the_heads_bin_it_copies(family, seed, copies, head_bins):
    rng = np.random.default_rng(seed)
    # At least as many items as bins: the packer never asks for more bins than items.
    sizes = lengths_of(family, rng, copies * head_bins + int(rng.integers(2, 200)), 4096)
    groups = Grouping(descending(sizes), copies)
    heads = groups.heads(sizes)
    head_bin = rng.integers(0, head_bins, heads.size)
    head_bin[:head_bins] = np.arange(head_bins)  # every head bin non-empty
    bins = groups.copies * head_bins + int(rng.integers(0, 3))
    bin_of = groups.spread(head_bin, head_bins, bins, sizes)
    head_load = np.bincount(head_bin, weights=heads, minlength=head_bins)
    load = np.bincount(bin_of, weights=sizes, minlength=bins)
    assert (np.bincount(bin_of, minlength=bins) > 0).all()
    assert load.max() <= head_load.max()
    copied = load[: groups.copies * head_bins].reshape(groups.copies, head_bins)
    assert (copied <= head_load).all()


def test_group_items_below_zero_is_an_error_that_names_the_override():
    with pytest.raises(SlimeHydraError, match=r"batching\.partitioner\.group_items=-1"):
        DynamicBatching(
            ParallelLayout(dp=2), None, 1024, partitioner=BalancedPacker(group_items=-1)
        )


@pytest.mark.parametrize("family", ["grpo", "oversize"])
def test_a_grouped_step_keeps_the_schedule_invariants(family, monkeypatch):
    spread = Grouping.spread
    spreads = []
    monkeypatch.setattr(
        Grouping, "spread", lambda self, *args: spreads.append(self.copies) or spread(self, *args)
    )
    sizes = lengths_of(family, np.random.default_rng(5), 4096, 4096)
    layout = ParallelLayout(dp=64, pp=2, vpp=2)
    strategy = DynamicBatching(
        layout, None, 4096, oversize="isolate", partitioner=BalancedPacker(group_items=256)
    )
    schedule = strategy.plan(sizes.tolist(), list(range(sizes.size)))
    assert spreads and spreads[0] > 1
    assert violations(schedule, layout, list(range(sizes.size)), allow_oversize=True) == []
