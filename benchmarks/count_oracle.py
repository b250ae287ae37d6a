"""Whether a step has a cap-safe packing into fewer bins than the planner found: the planner's
whole-step repair (partition.repair) with a budget of PASSES passes, from two starts, for
bench_planner to tell its misses of K_lb from counts nobody can reach. A packing found is
checked, so "found" proves a plan exists at that count; "not found" proves nothing.

The starts are first-fit decreasing's packing cut to the count (partition.construct.cut_to) and
largest fit in rounds (fit_rounds). On GRPO steps 98-99% full where the planner's paired repair
stalls thousands of tokens over the cap, this packs K_lb (docs/planner.md, tenth round); the
planner's count search runs the same repair on the same starts (on largest fit's after its
paired exchanges), within its count budget (batching.partitioner.repair_budget_per_sample), so
what this finds and the planner does not is what that budget did not pay for.
"""

from __future__ import annotations

import numpy as np

from slime_hydra.partition.base import PASS_OVERHEAD, Work
from slime_hydra.partition.construct import cut_to, fit_rounds
from slime_hydra.partition.greedy import first_fit_decreasing
from slime_hydra.partition.repair import pass_visits, repair

PASSES = 200  # whole-step passes a start may take (about 0.5 ms each at 4k samples)


def packs(sizes: np.ndarray, bins: int, cap: int, passes: int = PASSES) -> bool:
    """Whether the repair packs `sizes` (each <= cap) into exactly `bins` non-empty bins with
    every bin of two or more items within `cap`."""
    if bins <= 0 or len(sizes) < bins:
        return False
    ffd = first_fit_decreasing(sizes, cap)
    if int(ffd.max()) < bins:  # FFD needs no more bins: split its bins until there are enough
        return True
    starts = (cut_to(ffd, sizes, bins), fit_rounds(sizes, bins, cap))
    budget = passes * (pass_visits(len(sizes), len(sizes)) + PASS_OVERHEAD)
    return any(_packed(start, sizes, bins, cap, budget) for start in starts)


def _packed(bin_of: np.ndarray, sizes: np.ndarray, bins: int, cap: int, budget: int) -> bool:
    repair(bin_of, sizes, bins, cap, Work(budget))
    # The check, from the packing alone.
    final = np.bincount(bin_of, weights=sizes, minlength=bins)
    counts = np.bincount(bin_of, minlength=bins)
    return bool((counts > 0).all() and ((final <= cap) | (counts == 1)).all())
