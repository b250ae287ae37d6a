"""benchmarks/count_oracle.py: the whole-step repair bench_planner uses to tell a missed K_lb
from a count nobody can reach."""

from __future__ import annotations

import numpy as np

from benchmarks.count_oracle import packs
from slime_hydra.partition.greedy import first_fit_decreasing


def test_it_packs_the_count_first_fit_decreasing_misses():
    # Bins of 10: FFD puts 5 + 4, then 3 + 3 + 3, and the 2 fits neither: 3 bins. Cut to 2, the
    # 2 joins a bin (11); swapping its 4 for a 3 of the other (room 1) packs 5+3+2 and 4+3+3.
    sizes = np.array([5, 4, 3, 3, 3, 2])
    assert int(first_fit_decreasing(sizes, 10).max()) + 1 == 3
    assert packs(sizes, 2, 10)


def test_it_never_claims_a_count_no_packing_reaches():
    assert not packs(np.array([6, 6, 6]), 2, 10)  # three items over half the cap
    assert not packs(np.array([3, 3]), 3, 10)  # fewer items than bins: one would be empty
    assert packs(np.array([6, 6, 6]), 3, 10)  # FFD's own count
    assert packs(np.array([1, 1, 1, 1]), 3, 10)  # fewer bins than asked: split FFD's one bin
