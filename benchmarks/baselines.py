"""Plain, textbook baselines the benchmarks compare slime_hydra against (pure Python)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def textbook_kk(weights: Sequence[int], k: int) -> list[list[int]]:
    """Free-size Karmarkar-Karp into k parts, as verl/slime's get_seqlen_balanced_partitions.

    A state is k parts [sum, items], heaviest first. The two states with the largest spread
    are popped, the heaviest part of one joined with the lightest of the other (item lists
    concatenated), the result re-sorted and pushed back. Returns k lists of item indices.
    """
    heap: list[tuple[int, int, list[list]]] = []
    for tie, i in enumerate(sorted(range(len(weights)), key=lambda i: (weights[i], i))):
        parts: list[list] = [[weights[i], [i]]] + [[0, []] for _ in range(k - 1)]
        heapq.heappush(heap, (-weights[i], tie, parts))
    tie = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [[a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]] for j in range(k)]
        merged.sort(key=lambda part: part[0], reverse=True)
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], tie, merged))
        tie += 1
    return [sorted(items) for _, items in heap[0][2]] if heap else [[] for _ in range(k)]


def _halve(ids: list[int], lengths: Sequence[int]) -> tuple[list[int], list[int]]:
    """Split a bin into two non-empty halves by tokens: longest first into the lighter half."""
    halves: tuple[list[int], list[int]] = ([], [])
    sums = [0, 0]
    for i in sorted(ids, key=lambda i: -lengths[i]):
        h = 0 if sums[0] <= sums[1] else 1
        halves[h].append(i)
        sums[h] += lengths[i]
    return halves


def pack_first(
    lengths: Sequence[int], samples: Sequence[int], dp: int, cap: int, group: int
) -> list[list[list[int]]]:
    """A peer's pack-first scheduler: per-rank lists of micro-batches (global sample indices).

    First-fit in sample order under `cap`; then the largest multi-sample bin is halved until
    the bin count is a multiple of dp × group; then bins, heaviest first, are dealt to ranks
    round-robin. Raises ValueError when no bin is left to split.
    """
    ids = list(samples)
    bins = [[ids[j] for j in b] for b in first_fit_bins([lengths[i] for i in ids], cap)]
    room = [cap - sum(lengths[i] for i in b) for b in bins]
    step = dp * group
    while len(bins) % step:
        multi = [b for b in range(len(bins)) if len(bins[b]) > 1]
        if not multi:
            raise ValueError(f"{len(bins)} single-sample bins cannot make a multiple of {step}")
        b = max(multi, key=lambda b: cap - room[b])
        first, second = _halve(bins[b], lengths)
        bins[b] = first
        room[b] = cap - sum(lengths[i] for i in first)
        bins.append(second)
        room.append(cap - sum(lengths[i] for i in second))
    order = sorted(range(len(bins)), key=lambda b: room[b])
    return [[bins[b] for b in order[r::dp]] for r in range(dp)]


def verl_rearrange(
    lengths: Sequence[int],
    samples: Sequence[int],
    dp: int,
    max_token_len: int,
    group: int = 1,
    num_micro_batches: int | None = None,
) -> list[list[list[int]]]:
    """verl's rearrange_micro_batches (same_micro_num_in_dp), per its documented algorithm.

    The step is split over ranks by equal-size Karmarkar-Karp (verl's balance_batch); each rank
    asks for ceil(its tokens / max_token_len) micro-batches (at most its sample count); the
    count is all-reduced to the MAX and rounded up to the VPP group; each rank then splits its
    samples into that many parts by free-size Karmarkar-Karp. Parts are never checked against
    max_token_len, so they can break it. `num_micro_batches` forces the count (the same
    algorithm at another method's K, for comparisons at equal K).
    """
    ids = list(samples)
    split = textbook_kk_equal([lengths[i] for i in ids], dp)
    ranks = [[ids[j] for j in part] for part in split]
    k = max(min(len(r), -(-sum(lengths[i] for i in r) // max_token_len)) for r in ranks)
    k = -(-k // group) * group if num_micro_batches is None else num_micro_batches
    out = []
    for r in ranks:
        parts = textbook_kk([lengths[i] for i in r], k)
        out.append([[r[j] for j in part] for part in parts])
    return out


def textbook_kk_equal(weights: Sequence[int], k: int) -> list[list[int]]:
    """Equal-size Karmarkar-Karp into k parts (sizes differ by at most one; n padded with
    zero-weight fillers to a multiple of k, dropped after)."""
    n = len(weights)
    order = sorted(range(n), key=lambda i: (weights[i], i))
    padded: list[int | None] = [None] * ((-n) % k) + order
    heap: list[tuple[int, int, list[list]]] = []
    for tie, start in enumerate(range(0, len(padded), k)):
        parts = [
            [0 if i is None else weights[i], [] if i is None else [i]]
            for i in padded[start : start + k]
        ]
        parts.sort(key=lambda part: part[0], reverse=True)
        heapq.heappush(heap, (parts[-1][0] - parts[0][0], tie, parts))
    tie = len(heap)
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [[a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]] for j in range(k)]
        merged.sort(key=lambda part: part[0], reverse=True)
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], tie, merged))
        tie += 1
    return [sorted(items) for _, items in heap[0][2]]


def first_fit_bins(lengths: Sequence[int], cap: int) -> list[list[int]]:
    """Plain first-fit: each sample, in order, into the first bin with room under `cap` (a bin
    of its own when none has, or when it is over the cap). Lists of positions in `lengths`."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i, n in enumerate(lengths):
        for b, r in enumerate(room):
            if r >= n:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(cap - n)
    return bins
