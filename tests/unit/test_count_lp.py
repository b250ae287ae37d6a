"""benchmarks/count_lp.py: the LP bound bench_planner uses to prove a count out of reach."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.count_lp import lp_bins, lp_bins_lower_bound


def fewest_bins(sizes: list[int], cap: int) -> int:
    """The optimum by enumeration: each item to one of the bins opened so far or a new one."""
    best = len(sizes)

    def place(i: int, loads: list[int]) -> None:
        nonlocal best
        if len(loads) >= best:
            return
        if i == len(sizes):
            best = len(loads)
            return
        for b, load in enumerate(loads):
            if load + sizes[i] <= cap:
                loads[b] += sizes[i]
                place(i + 1, loads)
                loads[b] -= sizes[i]
        place(i + 1, [*loads, sizes[i]])

    place(0, [])
    return best


def test_seven_items_over_a_third_need_four_bins():
    # A bin holds two items of 34 under 100, so the LP covers 7 with columns of 2: 3.5 bins.
    assert abs(lp_bins_lower_bound(np.full(7, 34), 100) - 3.5) < 1e-6
    assert lp_bins(np.full(7, 34), 100) == 4


def test_items_over_half_cannot_share_and_halves_pair():
    # 6 and 6 alone (no 5 fits beside a 6), the three 5s two to a bin: 2 + 1.5 bins.
    assert abs(lp_bins_lower_bound(np.array([6, 6, 5, 5, 5]), 10) - 3.5) < 1e-6


@settings(max_examples=80, deadline=None)
@given(st.integers(512, 5000), st.data())
def test_never_above_the_optimum_and_never_below_the_volume(cap, data):
    # cap >= 1024 rounds sizes to quanta of 2-9 tokens: rounding them up would break the bound.
    sizes = data.draw(st.lists(st.integers(cap // 8, cap), min_size=1, max_size=7))
    bound = lp_bins_lower_bound(np.array(sizes), cap)
    assert lp_bins(np.array(sizes), cap) <= fewest_bins(sizes, cap)
    quantum = max(1, cap // 512)
    assert bound >= sum(s // quantum for s in sizes) / (cap // quantum) - 1e-6


def test_stopped_after_one_column_it_still_holds():
    rng = np.random.default_rng(7)
    sizes = rng.integers(20, 60, 9)
    early = lp_bins(sizes, 100, iterations=1)
    assert early <= fewest_bins(sizes.tolist(), 100)
    assert early <= lp_bins(sizes, 100)


def test_items_below_one_quantum_weigh_nothing():
    # cap 4096: a quantum of 8 tokens; items of 7 round to 0 and need no bin in the relaxation.
    assert lp_bins_lower_bound(np.full(10, 7), 4096) == 0.0
    assert lp_bins(np.array([7, 7, 3000, 3000]), 4096) == 2
