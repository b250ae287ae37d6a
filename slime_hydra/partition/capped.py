"""Cap-safe balanced partitioning: the fewest non-empty parts within a cap, then the flattest.

For each admissible count K, from the lower bound upwards in steps of the alignment, it tries
LPT (balanced), then best-fit decreasing and first-fit in input order (feasibility), each
followed by a local search that lowers the heaviest part by one move or swap at a time. Any
move that lowers the heaviest part keeps every part within the cap it already met, so balancing
never breaks feasibility. First-fit in input order makes the result never need more parts than
in-order first-fit packing does.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from slime_hydra.partition.base import PartitionError, Parts, align_up
from slime_hydra.partition.greedy import best_fit, descending, first_fit, lpt

PARTNERS = 8  # lightest parts tried per local-search round


def min_parts_bound(weights: Sequence[int], cap: int) -> int:
    """Lower bound on the parts any cap-respecting partition needs.

    ⌈Σw / cap⌉, and one part per item heavier than cap/2 (no two of those fit together).
    """
    total = sum(weights)
    return max(-(-total // cap), sum(1 for w in weights if 2 * w > cap), 1 if weights else 0)


def _fill_empty(parts: Parts, sums: list[int], weights: Sequence[int]) -> None:
    """Give every empty part the lightest item of the part holding the most items."""
    for p, part in enumerate(parts):
        if part:
            continue
        donor = max(range(len(parts)), key=lambda q: len(parts[q]))
        i = min(parts[donor], key=weights.__getitem__)
        parts[donor].remove(i)
        sums[donor] -= weights[i]
        part.append(i)
        sums[p] = weights[i]


def _best_exchange(
    heavy: list[int], light: list[int], gap: int, weights: Sequence[int]
) -> tuple[int | None, int | None, int]:
    """The move (item, None) or swap (item, item) from `heavy` to `light` whose weight shift d
    lies in (0, gap) and is nearest gap/2, with d; (None, None, 0) if none lowers the pair max."""
    best: tuple[int | None, int | None, int] = (None, None, 0)
    best_err = gap  # |d - gap/2| * 2 must beat this
    light_sorted = sorted(light, key=weights.__getitem__)
    light_w = [weights[j] for j in light_sorted]
    for i in heavy:
        x = weights[i]
        if len(heavy) > 1 and 0 < x < gap and abs(2 * x - gap) < best_err:
            best, best_err = (i, None, x), abs(2 * x - gap)
        # swap i for j: d = x - y, ideally y = x - gap/2
        pos = bisect.bisect_left(light_w, x - gap / 2)
        for q in (pos - 1, pos):
            if 0 <= q < len(light_w):
                d = x - light_w[q]
                if 0 < d < gap and abs(2 * d - gap) < best_err:
                    best, best_err = (i, light_sorted[q], d), abs(2 * d - gap)
    return best


def refine(
    parts: Parts, sums: list[int], weights: Sequence[int], goal: int, max_rounds: int
) -> None:
    """Lower the heaviest part by single moves or swaps with the lightest parts, in place.

    Stops once the heaviest part is within `goal`, when no exchange helps, or after max_rounds.
    """
    loads = sums
    parts_ids = range(len(parts))
    for _ in range(max_rounds):
        p = max(parts_ids, key=loads.__getitem__)
        top = loads[p]
        if top <= goal:
            break
        for q in heapq.nsmallest(PARTNERS, parts_ids, key=loads.__getitem__):
            gap = top - loads[q]
            if gap <= 1:
                break
            i, j, d = _best_exchange(parts[p], parts[q], gap, weights)
            if i is None:
                continue
            parts[p].remove(i)
            parts[q].append(i)
            if j is not None:
                parts[q].remove(j)
                parts[p].append(j)
            loads[p] -= d
            loads[q] += d
            break
        else:
            break


def capped_partition(
    weights: Sequence[int],
    cap: int,
    *,
    align: int = 1,
    offset: int = 0,
    min_parts: int = 1,
    floor: int = 0,
    tolerance: float = 0.01,
    refine_rounds: int | None = None,
) -> Parts:
    """Split item indices into the fewest non-empty parts each within `cap`, then balance them.

    The count K satisfies K >= min_parts and (K + offset) % align == 0. Balancing stops once the
    heaviest part is within (1 + tolerance) × the bound max(max w, ⌈Σw/K⌉), or within `floor`
    (a heavier part the caller has elsewhere, which no balancing here can undercut). Raises
    PartitionError if an item exceeds `cap` or if K would exceed the number of items (some part
    would be empty).
    """
    n = len(weights)
    if n == 0:
        raise PartitionError("nothing to partition: no items")
    heaviest = max(weights)
    if heaviest > cap:
        raise PartitionError(f"an item of weight {heaviest} exceeds the cap {cap}")
    total = sum(weights)
    order = descending(weights)
    k = align_up(max(min_parts, min_parts_bound(weights, cap)), align, offset)
    while k <= n:
        goal = min(cap, max(floor, int(max(heaviest, -(-total // k)) * (1 + tolerance))))
        rounds = 4 * k if refine_rounds is None else refine_rounds
        # When balance within tolerance would already touch the cap, any feasible packing is
        # balanced enough: pack tightly first instead of balancing first.
        tight = goal == cap
        packings = (_lpt_packing, _best_fit_decreasing, _first_fit_in_order)
        for packing in (packings[1], packings[0], packings[2]) if tight else packings:
            parts = packing(weights, cap, k, order)
            if parts is None:
                continue
            sums = [sum(map(weights.__getitem__, part)) for part in parts]
            _fill_empty(parts, sums, weights)
            refine(parts, sums, weights, goal, rounds)
            if max(sums) <= cap:
                for part in parts:
                    part.sort()
                return parts
        k += align
    raise PartitionError(
        f"{n} items cannot fill {k - align} or fewer non-empty parts (at least {min_parts}, "
        f"aligned to {align} with offset {offset}) within cap {cap}"
    )


def _lpt_packing(weights: Sequence[int], cap: int, k: int, order: list[int]) -> Parts:
    """LPT into exactly k parts (balanced, may break the cap)."""
    del cap
    return lpt(weights, k, order)


def _best_fit_decreasing(
    weights: Sequence[int], cap: int, k: int, order: list[int]
) -> Parts | None:
    """Best-fit, heaviest first, into k bins (tight packing, may leave parts empty)."""
    return best_fit(weights, cap, k, order)


def _first_fit_in_order(weights: Sequence[int], cap: int, k: int, order: list[int]) -> Parts | None:
    """First-fit in input order into at most k bins: never needs more than a pack-first plan."""
    del order
    parts = first_fit(weights, cap, None, max_bins=k)
    return None if parts is None else parts + [[] for _ in range(k - len(parts))]


@dataclass(frozen=True)
class CappedPartitioner:
    """The default Partitioner: `capped_partition` with its balance tolerance and round bound."""

    tolerance: float = 0.01
    refine_rounds: int | None = None

    def __call__(
        self,
        weights: Sequence[int],
        cap: int,
        *,
        align: int = 1,
        offset: int = 0,
        min_parts: int = 1,
        floor: int = 0,
    ) -> Parts:
        return capped_partition(
            weights,
            cap,
            align=align,
            offset=offset,
            min_parts=min_parts,
            floor=floor,
            tolerance=self.tolerance,
            refine_rounds=self.refine_rounds,
        )
