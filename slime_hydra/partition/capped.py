"""Cap-safe balanced partitioning: the fewest non-empty parts within a cap, then the flattest.

For each admissible count K, from the lower bound upwards in steps of the alignment, it tries
LPT (balanced), then first-fit decreasing and first-fit in input order (feasibility), each
followed by a local search that lowers the heaviest part by one move or swap at a time. Any
move that lowers the heaviest part keeps every part within the cap it already met, so balancing
never breaks feasibility. First-fit in input order makes the result never need more parts than
in-order first-fit packing does.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from slime_hydra.partition.base import PartitionError, Parts, align_up
from slime_hydra.partition.greedy import descending, first_fit, lpt


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


def refine(parts: Parts, sums: list[int], weights: Sequence[int], max_rounds: int) -> None:
    """Lower the heaviest part by single moves or swaps with lighter parts, in place.

    Stops at the lower bound max(max w, ⌈Σw/K⌉), when no exchange helps, or after max_rounds.
    """
    k = len(parts)
    bound = max(max(weights), -(-sum(sums) // k)) if weights else 0
    for _ in range(max_rounds):
        p = max(range(k), key=sums.__getitem__)
        if sums[p] <= bound:
            return
        for q in sorted(range(k), key=sums.__getitem__):
            gap = sums[p] - sums[q]
            if gap <= 1:
                return
            i, j, d = _best_exchange(parts[p], parts[q], gap, weights)
            if i is None:
                continue
            parts[p].remove(i)
            parts[q].append(i)
            if j is not None:
                parts[q].remove(j)
                parts[p].append(j)
            sums[p] -= d
            sums[q] += d
            break
        else:
            return


def capped_partition(
    weights: Sequence[int],
    cap: int,
    *,
    align: int = 1,
    offset: int = 0,
    min_parts: int = 1,
    refine_rounds: int | None = None,
) -> Parts:
    """Split item indices into the fewest non-empty parts each within `cap`, then balance them.

    The count K satisfies K >= min_parts and (K + offset) % align == 0. Raises PartitionError if
    an item exceeds `cap` or if K would exceed the number of items (some part would be empty).
    """
    n = len(weights)
    if n == 0:
        raise PartitionError("nothing to partition: no items")
    heaviest = max(weights)
    if heaviest > cap:
        raise PartitionError(f"an item of weight {heaviest} exceeds the cap {cap}")
    order = descending(weights)
    k = align_up(max(min_parts, min_parts_bound(weights, cap)), align, offset)
    while k <= n:
        rounds = 4 * k if refine_rounds is None else refine_rounds
        for packing, packing_order in ((lpt, order), (first_fit, order), (first_fit, None)):
            if packing is lpt:
                parts = lpt(weights, k, order)
            else:
                parts = first_fit(weights, cap, packing_order, max_bins=k)
            if parts is None:
                continue
            parts += [[] for _ in range(k - len(parts))]
            sums = [sum(weights[i] for i in part) for part in parts]
            _fill_empty(parts, sums, weights)
            refine(parts, sums, weights, rounds)
            if max(sums) <= cap:
                for part in parts:
                    part.sort()
                return parts
        k += align
    raise PartitionError(
        f"{n} items cannot fill {k} non-empty parts (at least {min_parts}, aligned to "
        f"{align} with offset {offset}) within cap {cap}"
    )


@dataclass(frozen=True)
class CappedPartitioner:
    """The default Partitioner: `capped_partition` with a bound on local-search rounds."""

    refine_rounds: int | None = None

    def __call__(
        self,
        weights: Sequence[int],
        cap: int,
        *,
        align: int = 1,
        offset: int = 0,
        min_parts: int = 1,
    ) -> Parts:
        return capped_partition(
            weights,
            cap,
            align=align,
            offset=offset,
            min_parts=min_parts,
            refine_rounds=self.refine_rounds,
        )
