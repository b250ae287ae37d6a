"""A lower bound on the bins of a step from the LP relaxation of bin packing (Gilmore-Gomory:
one column per way to fill a bin), for bench_planner to tell a count nobody can reach from a
count the planner missed: where dp·(K - g) bins are below it, no plan has fewer micro-batches
than the planner's. Every bound of partition.bounds is at most this LP's optimum.

Column generation: the master LP (HiGHS, through scipy) covers each size's demand with the
columns found so far; its duals price a new column by an exact bounded knapsack (a 0/1 dynamic
program over the sizes' demands split in powers of two). Whatever the iteration it stops at,
Farley's bound (the duals' total over the best column's price, where that is above 1) holds, so
stopping early only weakens it. Sizes are rounded down to multiples of a quantum so that the
program runs over cap / quantum capacities: a packing of the true sizes packs the rounded ones,
so the rounded step's bound is a bound on the true one. Too slow for the planner (seconds a
step); it runs only on the steps bench_planner finds above K_lb.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linprog

CAPACITY_UNITS = 512
"""Knapsack capacities the sizes are rounded to (the quantum is cap // CAPACITY_UNITS tokens)."""
EPS = 1e-6
"""Slack for the LP solver's tolerances when the bound is rounded up to whole bins."""


def lp_bins_lower_bound(
    sizes: np.ndarray,
    cap: int,
    iterations: int = 600,
    start: np.ndarray | None = None,
) -> float:
    """A proven lower bound on the bins of any packing of `sizes` (each <= cap) into bins of
    `cap` (fractional: ⌈bound - EPS⌉ bins at least), after at most `iterations` columns;
    `start`, a packing's bin of each item, seeds the master with its bins."""
    quantum = max(1, cap // CAPACITY_UNITS)
    units = np.asarray(sizes, dtype=np.int64) // quantum
    capacity = cap // quantum
    vals, item_type, demand = np.unique(units, return_inverse=True, return_counts=True)
    if vals[0] == 0:  # items under one quantum weigh nothing in the relaxation
        if vals.size == 1:
            return 0.0
        vals, demand, item_type = vals[1:], demand[1:], item_type - 1
    m = vals.size
    # One size as often as a bin holds it: the rows of a diagonal matrix, built once.
    columns = list(np.diag(np.minimum(demand, capacity // vals)))
    if start is not None:  # its distinct bins
        kept = item_type >= 0
        bins = np.unique(start[kept], return_inverse=True)[1]
        filled = np.bincount(bins * m + item_type[kept], minlength=(int(bins.max()) + 1) * m)
        columns.extend(np.unique(filled.reshape(-1, m), axis=0))
    # The knapsack's 0/1 items: each size's demand split in 1, 2, 4, ... (any count reachable).
    kind, times = _split(demand)
    weight = vals[kind] * times
    best = 0.0
    for _ in range(iterations):
        a = np.array(columns, dtype=np.float64).T
        res = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-demand, bounds=(0, None), method="highs")
        if res.status != 0:
            break
        duals = np.maximum(-res.ineqlin.marginals, 0.0)
        price, chosen = _knapsack(weight, duals[kind] * times, capacity)
        best = max(best, float(demand @ duals) / max(1.0, price))
        if price <= 1 + EPS:
            break
        column = np.bincount(kind[chosen], weights=times[chosen], minlength=m)
        columns.append(column.astype(np.int64))
    return best


def lp_bins(sizes: np.ndarray, cap: int, **kwargs: object) -> int:
    """The whole bins `lp_bins_lower_bound` proves."""
    return math.ceil(lp_bins_lower_bound(sizes, cap, **kwargs) - EPS)


def _split(demand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each size's demand as 0/1 items of 1, 2, 4, ... copies and the rest: (size, copies)."""
    kind, times = [], []
    for i, d in enumerate(demand.tolist()):
        step = 1
        while d > 0:
            take = min(step, d)
            kind.append(i)
            times.append(take)
            d -= take
            step *= 2
    return np.asarray(kind, dtype=np.int64), np.asarray(times, dtype=np.int64)


def _knapsack(weight: np.ndarray, value: np.ndarray, capacity: int) -> tuple[float, np.ndarray]:
    """The 0/1 knapsack's best value within `capacity` and the items it takes."""
    best = np.zeros(capacity + 1)
    took = np.zeros((weight.size, capacity + 1), dtype=bool)
    for i, (w, v) in enumerate(zip(weight.tolist(), value.tolist(), strict=True)):
        if w > capacity or v <= 0:
            continue
        with_it = best[: capacity + 1 - w] + v
        better = with_it > best[w:]
        took[i, w:] = better
        best[w:] = np.where(better, with_it, best[w:])
    c = int(best.argmax())
    value_at = float(best[c])
    chosen = np.zeros(weight.size, dtype=bool)
    for i in range(weight.size - 1, -1, -1):
        if took[i, c]:
            chosen[i] = True
            c -= int(weight[i])
    return value_at, chosen
