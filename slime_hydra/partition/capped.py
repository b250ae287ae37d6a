"""Cap-safe balanced partitioning: the fewest non-empty parts within a cap, then the flattest.

Two measures per item: its `size` (tokens), which the cap limits, and its `weight` (tokens, or
FLOPs a·L + b·L²), which balancing flattens; by default they are the same. For each admissible
count K, from the lower bound upwards in steps of the alignment, it tries LPT on weights
(balanced), then best-fit decreasing and first-fit in input order on sizes (feasibility), each
followed by a local search that lowers the heaviest part by one move or swap at a time and
never takes a part over the cap. Balancing stops once the heaviest part is within the
tolerance of a proven lower bound (partition.bounds) at that K, or when no exchange helps.
First-fit in input order makes the result never need more parts than in-order first-fit
packing does.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from slime_hydra.partition.base import PartitionError, Parts, align_up
from slime_hydra.partition.bounds import max_part_lower_bound, min_bins_lower_bound
from slime_hydra.partition.greedy import best_fit, descending, first_fit, lpt

PARTNERS = 8  # lightest parts tried per local-search round


def _fill_empty(
    parts: Parts, sums: list[int], loads: list[int], weights: Sequence[int], sizes: Sequence[int]
) -> None:
    """Give every empty part the lightest item of the part holding the most items."""
    for p, part in enumerate(parts):
        if part:
            continue
        donor = max(range(len(parts)), key=lambda q: len(parts[q]))
        i = min(parts[donor], key=weights.__getitem__)
        parts[donor].remove(i)
        sums[donor] -= weights[i]
        loads[donor] -= sizes[i]
        part.append(i)
        sums[p] = weights[i]
        loads[p] = sizes[i]


def _best_exchange(
    heavy: list[int],
    light: list[int],
    gap: int,
    weights: Sequence[int],
    sizes: Sequence[int],
    rooms: tuple[int, int],
) -> tuple[int | None, int | None, int]:
    """The move (item, None) or swap (item, item) from `heavy` to `light` whose weight shift d
    lies in (0, gap) and is nearest gap/2, with d; (None, None, 0) if none lowers the pair max.
    `rooms` = (heavy's, light's) size left under the cap, which no exchange may overdraw."""
    best: tuple[int | None, int | None, int] = (None, None, 0)
    best_err = gap  # |d - gap/2| * 2 must beat this
    room_heavy, room_light = rooms
    light_sorted = sorted(light, key=weights.__getitem__)
    light_w = [weights[j] for j in light_sorted]
    for i in heavy:
        x = weights[i]
        if (
            len(heavy) > 1
            and 0 < x < gap
            and abs(2 * x - gap) < best_err
            and sizes[i] <= room_light
        ):
            best, best_err = (i, None, x), abs(2 * x - gap)
        # swap i for j: d = x - y, ideally y = x - gap/2
        pos = bisect.bisect_left(light_w, x - gap / 2)
        for q in (pos - 1, pos):
            if 0 <= q < len(light_w):
                d = x - light_w[q]
                if 0 < d < gap and abs(2 * d - gap) < best_err:
                    shift = sizes[i] - sizes[light_sorted[q]]
                    if shift <= room_light and -shift <= max(room_heavy, 0):
                        best, best_err = (i, light_sorted[q], d), abs(2 * d - gap)
    return best


def refine(
    parts: Parts,
    sums: list[int],
    weights: Sequence[int],
    goal: int,
    max_rounds: int,
    sizes: Sequence[int] | None = None,
    loads: list[int] | None = None,
    cap: int | None = None,
) -> bool:
    """Lower the heaviest part (by weight) by single moves or swaps with the lightest parts,
    in place, keeping every part's size (`loads`, default the weights) within `cap`.

    Stops once the heaviest part is within `goal`, when no exchange helps, or after max_rounds;
    returns True only in the last case (more rounds might still help).
    """
    if sizes is None or loads is None:
        sizes, loads = weights, sums
    limit = (1 << 62) if cap is None else cap
    parts_ids = range(len(parts))
    for _ in range(max_rounds):
        p = max(parts_ids, key=sums.__getitem__)
        top = sums[p]
        if top <= goal:
            return False
        for q in heapq.nsmallest(PARTNERS, parts_ids, key=sums.__getitem__):
            gap = top - sums[q]
            if gap <= 1:
                return False
            rooms = (limit - loads[p], limit - loads[q])
            i, j, d = _best_exchange(parts[p], parts[q], gap, weights, sizes, rooms)
            if i is None:
                continue
            parts[p].remove(i)
            parts[q].append(i)
            shift = sizes[i]
            if j is not None:
                parts[q].remove(j)
                parts[p].append(j)
                shift -= sizes[j]
            if loads is not sums:
                loads[p] -= shift
                loads[q] += shift
            sums[p] -= d
            sums[q] += d
            break
        else:
            return False
    return True


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
    sizes: Sequence[int] | None = None,
) -> Parts:
    """Split item indices into the fewest non-empty parts each within `cap`, then balance them.

    `sizes` (default: the weights) are what the cap limits; `weights` are what is balanced.
    The count K satisfies K >= min_parts and (K + offset) % align == 0. Balancing stops once
    the heaviest part is within (1 + tolerance) × a proven lower bound on it at K
    (`max_part_lower_bound`), or within `floor` (a heavier part the caller has elsewhere, which
    no balancing here can undercut), or when no move or swap lowers it. Raises PartitionError
    if an item exceeds `cap` or if K would exceed the number of items (some part would be
    empty).
    """
    sizes = weights if sizes is None else sizes
    n = len(weights)
    if n == 0:
        raise PartitionError("nothing to partition: no items")
    largest = max(sizes)
    if largest > cap:
        raise PartitionError(f"an item of size {largest} exceeds the cap {cap}")
    heaviest, total = max(weights), sum(weights)
    total_size = sum(sizes)
    order = descending(weights)
    k = align_up(max(min_parts, min_bins_lower_bound(sizes, cap)), align, offset)
    while k <= n:
        # A cheap goal first (the mean bound); the proven bound only if that is missed.
        goal = max(floor, int(max(heaviest, -(-total // k)) * (1 + tolerance)))
        rounds = 4 * k if refine_rounds is None else refine_rounds
        # When balance within tolerance would already touch the cap, any feasible packing is
        # balanced enough: pack tightly first instead of balancing first.
        tight = max(largest, -(-total_size // k)) * (1 + tolerance) >= cap
        packings = (_lpt_packing, _best_fit_decreasing, _first_fit_in_order)
        for packing in (packings[1], packings[0], packings[2]) if tight else packings:
            parts = packing(weights, sizes, cap, k, order)
            if parts is None:
                continue
            sums = [sum(map(weights.__getitem__, part)) for part in parts]
            loads = sums if sizes is weights else [sum(map(sizes.__getitem__, p)) for p in parts]
            _fill_empty(parts, sums, loads, weights, sizes)
            more = refine(parts, sums, weights, goal, rounds, sizes, loads, cap)
            if max(loads) > cap:  # LPT broke the cap and balancing did not repair it
                continue
            if more:
                top = max(sums)
                bound = max_part_lower_bound(weights, k, upper=top, rel_tol=tolerance / 8)
                # Rounds ran out above the cheap goal: go on only while above the bound's.
                proven_goal = max(goal, int(bound * (1 + tolerance)))
                if top > proven_goal:
                    refine(parts, sums, weights, proven_goal, 4 * rounds, sizes, loads, cap)
            for part in parts:
                part.sort()
            return parts
        k += align
    raise PartitionError(
        f"{n} items cannot fill {k - align} or fewer non-empty parts (at least {min_parts}, "
        f"aligned to {align} with offset {offset}) within cap {cap}"
    )


def _lpt_packing(
    weights: Sequence[int], sizes: Sequence[int], cap: int, k: int, order: list[int]
) -> Parts:
    """LPT on weights into exactly k parts (balanced, may break the cap)."""
    del sizes, cap
    return lpt(weights, k, order)


def _best_fit_decreasing(
    weights: Sequence[int], sizes: Sequence[int], cap: int, k: int, order: list[int]
) -> Parts | None:
    """Best-fit on sizes, heaviest first, into k bins (tight packing, may leave parts empty).
    Weights grow with sizes (tokens, or a·L + b·L²), so `order` is by size as well."""
    del weights
    return best_fit(sizes, cap, k, order)


def _first_fit_in_order(
    weights: Sequence[int], sizes: Sequence[int], cap: int, k: int, order: list[int]
) -> Parts | None:
    """First-fit on sizes in input order into at most k bins: never needs more than a
    pack-first plan."""
    del weights, order
    parts = first_fit(sizes, cap, None, max_bins=k)
    return None if parts is None else parts + [[] for _ in range(k - len(parts))]


@dataclass(frozen=True)
class CappedPartitioner:
    """The default Partitioner: `capped_partition` with its balance tolerance and round bound
    (config: batching.partitioner, whose schema is derived from these fields)."""

    tolerance: float = 0.01
    """Stop balancing once the heaviest micro-batch is within this fraction of the bound."""
    refine_rounds: int | None = None
    """Local-search rounds per packing; null means 4 × the part count."""

    def __call__(
        self,
        weights: Sequence[int],
        cap: int,
        *,
        align: int = 1,
        offset: int = 0,
        min_parts: int = 1,
        floor: int = 0,
        sizes: Sequence[int] | None = None,
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
            sizes=sizes,
        )
