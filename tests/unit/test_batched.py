"""partition.batched: the even split over ranks and the packing of all ranks at once."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.batched import descending, pack_groups, place_spilled, split_even
from slime_hydra.schedule import (
    DynamicBatching,
    ParallelLayout,
    microbatch_lower_bound,
    violations,
)

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_descending_breaks_ties_by_index():
    assert descending(np.array([3, 5, 3, 5, 1])).tolist() == [1, 3, 0, 2, 4]


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


@PROPERTY
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 12),
    st.integers(1, 8),
    st.integers(50, 2000),
    st.booleans(),
)
def test_pack_groups_reports_honestly_what_fits(seed, groups, k, cap, best_fit):
    rng = random.Random(seed)
    n = groups * rng.randint(1, 12)
    sizes = np.array([rng.randint(1, cap) for _ in range(n)], dtype=np.int64)
    cols = split_even(sizes, groups, 0.0)
    part, room = pack_groups(cols, sizes, sizes, k, cap, best_fit)
    assert part.shape == cols.shape and room.shape == (groups, k)
    for g in range(groups):
        members = (cols[:, g] >= 0) & (part[:, g] >= 0)
        if not best_fit:
            assert members.sum() == (cols[:, g] >= 0).sum()  # LPT places every item
        loads = np.bincount(part[members, g], weights=sizes[cols[members, g]], minlength=k)
        assert (cap - loads == room[g]).all()
        if best_fit:
            assert (room[g] >= 0).all()
    placed = place_spilled(cols, part, room.copy(), sizes)
    if placed is not None:
        new_cols, new_part = placed
        assert sorted(new_cols[new_cols >= 0].tolist()) == list(range(n))
        assert (new_part[new_cols >= 0] >= 0).all()
        for g in range(groups):
            members = new_cols[:, g] >= 0
            loads = np.bincount(new_part[members, g], weights=sizes[new_cols[members, g]])
            assert best_fit is False or (loads <= cap).all()


@st.composite
def many_ranks(draw: st.DrawFn):
    """Layouts with enough ranks that DynamicBatching packs them all at once."""
    dp = draw(st.sampled_from([8, 16, 32]))
    g = draw(st.sampled_from([1, 2]))
    layout = (
        ParallelLayout(dp=dp, pp=2, vpp=2, microbatch_group_size_per_vp_stage=2)
        if g > 1
        else ParallelLayout(dp=dp)
    )
    cap = draw(st.integers(200, 5000))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = dp * draw(st.integers(2, 40))
    mix = draw(st.floats(0.0, 1.0))
    lengths = [
        rng.randint(cap // 2 + 1, cap) if rng.random() < mix else rng.randint(1, cap // 3)
        for _ in range(n)
    ]
    return layout, cap, lengths


@PROPERTY
@given(many_ranks(), st.sampled_from(["tokens", "flops"]), st.sampled_from(["kk", "auto"]))
def test_packing_all_ranks_at_once_keeps_every_invariant(case, balance, split):
    layout, cap, lengths = case
    groups = list(range(len(lengths)))
    strategy = DynamicBatching(
        layout, None, cap, dp_split=split, balance=balance, flops_coefficients=(1.0, 1 / 64)
    )
    try:
        schedule = strategy.plan(lengths, groups)
    except SlimeHydraError as exc:  # only "cannot fill" errors, with the usual message
        assert "non-empty micro-batches" in str(exc)
        return
    assert violations(schedule, layout, groups) == []
    k_lb = microbatch_lower_bound(lengths, cap, layout.dp, layout.microbatch_alignment)
    assert schedule.steps[0].num_microbatches >= k_lb


def test_a_tight_grpo_like_step_reaches_the_lower_bound_on_k():
    # 4,096 samples on 32 ranks at about 97% of the cap: best-fit decreasing on every rank
    # at once finds the lower bound on K.
    rng = np.random.default_rng(7)
    cap = 16_384
    lengths = np.minimum(
        rng.integers(16, 1024, 4096) + rng.lognormal(np.log(2048), 0.9, 4096).astype(int), cap
    ).tolist()
    layout = ParallelLayout(dp=32)
    schedule = DynamicBatching(layout, None, cap).plan(lengths, list(range(4096)))
    assert violations(schedule, layout, list(range(4096))) == []
    k_lb = microbatch_lower_bound(lengths, cap, 32, 1)
    assert schedule.steps[0].num_microbatches == k_lb
