"""Many capped partitions at once: a step's items split evenly over G groups (DP ranks), then
every group packed into the same number of parts K, with numpy across the groups.

- `descending`: item order heaviest first, ties by index, from unique sort keys, so every
  machine (whatever numpy's sort kernel) gets the same order.
- `split_even`: rounds of G items, heaviest first; in each round the heaviest item goes to the
  lightest group (snake order for all but the last `LPT_ROUNDS` rounds when there are many),
  then swaps within a round between the heaviest and the lightest group. Every group takes one
  item per round, so group sizes differ by at most one, and so do the counts of items above
  any size (the items over cap/2 that need parts of their own): each group's lower bound on K
  is the step's, divided by G.
- `pack_groups`: each group's items, heaviest first, into K parts: LPT (into the lightest
  part) or best-fit decreasing (into the fullest part with room under the cap), one item of
  every group per numpy operation. O(items per group × G·K) numpy work and one Python
  iteration per item of a group: for many groups of moderate K far cheaper than packing the
  groups one by one; `worth_batching` says when.
"""

from __future__ import annotations

import bisect

import numpy as np

LPT_ROUNDS = 256  # rounds dealt lightest-first at the end; earlier ones in snake order
SWAP_ROUNDS = 64  # swaps between the heaviest and the lightest group, at most


def descending(weights: np.ndarray) -> np.ndarray:
    """Indices by weight, heaviest first, ties by index; the same on every machine."""
    n = len(weights)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    top = int(weights.max())
    low = int(weights.min())
    if (top - low + 1) * n < (1 << 62) and weights.dtype.kind in "iu":
        return np.argsort((top - weights.astype(np.int64)) * n + np.arange(n))
    return np.lexsort((np.arange(n), -weights))


def split_even(weights: np.ndarray, groups: int, tolerance: float = 0.0) -> np.ndarray:
    """A (rounds, groups) matrix of item indices (-1 pads the last round): column g holds group
    g's items, heaviest first, one per round. Group totals of `weights` are evened by
    lightest-first dealing and swaps within a round, stopping once the heaviest group is within
    `tolerance` of the mean."""
    n = len(weights)
    order = descending(weights)
    rounds = -(-n // groups)
    pad = rounds * groups - n
    idx = np.concatenate((order, np.full(pad, -1, dtype=np.int64))).reshape(rounds, groups)
    w = np.concatenate((weights[order], np.zeros(pad, dtype=weights.dtype)))
    w = w.reshape(rounds, groups)
    out = np.empty_like(idx)
    wout = np.empty_like(w)
    snake = max(0, rounds - LPT_ROUNDS)
    snake -= snake % 2
    if snake:
        out[:snake:2], wout[:snake:2] = idx[:snake:2], w[:snake:2]
        out[1:snake:2], wout[1:snake:2] = idx[1:snake:2, ::-1], w[1:snake:2, ::-1]
        loads = wout[:snake].sum(0)
    else:
        loads = np.zeros(groups, dtype=w.dtype)
    for r in range(snake, rounds):
        perm = np.argsort(loads, kind="stable")
        out[r, perm] = idx[r]
        wout[r, perm] = w[r]
        loads[perm] += w[r]
    if groups > 1:
        _swap_within_rounds(out, wout, loads, tolerance)
    return out


def _swap_within_rounds(
    idx: np.ndarray, w: np.ndarray, loads: np.ndarray, tolerance: float
) -> None:
    """Swap one round's items between the heaviest and the lightest group, the swap that
    brings them nearest each other, while that lowers the heaviest and it is above the mean by
    more than `tolerance`. Sizes per group and per round stay as they are."""
    total = loads.sum()
    groups = len(loads)
    for _ in range(SWAP_ROUNDS):
        p, q = int(loads.argmax()), int(loads.argmin())
        gap = loads[p] - loads[q]
        if gap <= 0 or loads[p] * groups <= (1 + tolerance) * total:
            return
        d = w[:, p] - w[:, q]
        err = np.where((d > 0) & (d < gap), np.abs(2 * d - gap), gap)
        r = int(err.argmin())
        if err[r] >= gap:
            return
        idx[r, p], idx[r, q] = idx[r, q], idx[r, p]
        w[r, p], w[r, q] = w[r, q], w[r, p]
        loads[p] -= d[r]
        loads[q] += d[r]


def worth_batching(groups: int, per_group: int, k: int) -> bool:
    """Whether `pack_groups` beats packing each group alone: about 12 µs of numpy calls plus
    5 ns per part per round, against about 3 µs per item one group at a time."""
    return groups >= 4 and per_group * (12 + 0.005 * groups * k) < 3 * groups * per_group


def pack_groups(
    idx: np.ndarray,
    sizes: np.ndarray,
    weights: np.ndarray,
    k: int,
    cap: int,
    best_fit: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Part (0..k-1) of every entry of `idx` (as from `split_even`; -1 entries are ignored),
    and each group's size left under `cap` per part (groups × k; negative where over it).

    LPT puts each item into its group's lightest part by `weights`, whatever the cap.
    Best-fit decreasing (`best_fit`) puts it into the fullest part that still has room for its
    size; an item that fits no part of its group gets part -1 (the caller may place it in
    another group's room). `sizes` and `weights` are per item index."""
    rounds, groups = idx.shape
    valid = idx >= 0
    safe = np.where(valid, idx, 0)
    s = np.where(valid, sizes[safe], 0)
    rows = np.arange(groups)
    part = np.empty((rounds, groups), dtype=np.int64)
    if best_fit:
        room = np.full((groups, k), cap, dtype=np.int64)
        none = cap + 1
        for r in range(rounds):
            sr = s[r]
            b = np.where(room >= sr[:, None], room, none).argmin(1)
            got = room[rows, b]
            fits = got >= sr
            room[rows, b] = np.where(fits, got - sr, got)
            part[r] = np.where(fits, b, -1)
        return part, room
    w = np.where(valid, weights[safe], 0)
    load = np.zeros((groups, k), dtype=w.dtype)
    used = np.zeros((groups, k), dtype=np.int64)
    first = min(k, rounds)
    part[:first] = np.arange(first)[:, None]  # LPT fills the empty parts first, in order
    load[:, :first] = w[:first].T
    used[:, :first] = s[:first].T
    for r in range(first, rounds):
        b = load.argmin(1)
        part[r] = b
        load[rows, b] += w[r]
        used[rows, b] += s[r]
    return part, cap - used


def place_spilled(
    idx: np.ndarray, part: np.ndarray, room: np.ndarray, sizes: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Best-fit the items left with part -1 (heaviest first) into the fullest part of any
    group with room (`room`, groups × k, updated); None if one fits nowhere. An item placed in
    another group moves to that group's column, in rows added at the bottom: returns the item
    and part matrices, widened so."""
    idx, part = idx.copy(), part.copy()
    spilled = np.argwhere((part < 0) & (idx >= 0))
    if spilled.size == 0:
        return idx, part
    groups, k = room.shape
    flat_room = room.ravel()
    # Keys room × slots + slot, sorted: bisect finds the fullest part with room for an item.
    slots = groups * k
    keys = sorted((flat_room * slots + np.arange(slots)).tolist())
    items = sorted(
        ((int(sizes[idx[r, g]]), int(r), int(g)) for r, g in spilled.tolist()), reverse=True
    )
    extra: list[tuple[int, int, int]] = []  # (item, group, part) moved to another column
    for size, r, g in items:
        at = bisect.bisect_left(keys, size * slots)
        if at == len(keys):
            return None
        key = keys.pop(at)
        slot = key % slots
        bisect.insort(keys, key - size * slots)
        flat_room[slot] -= size
        to_group, to_part = divmod(slot, k)
        if to_group == g:
            part[r, g] = to_part
        else:
            extra.append((int(idx[r, g]), to_group, to_part))
            idx[r, g] = -1
    if not extra:
        return idx, part
    # Extra rows at the bottom hold the moved items in their new columns.
    rows = max(sum(1 for _, grp, _ in extra if grp == g2) for g2 in {e[1] for e in extra})
    more_idx = np.full((rows, groups), -1, dtype=idx.dtype)
    more_part = np.zeros((rows, groups), dtype=part.dtype)
    fill = dict.fromkeys({e[1] for e in extra}, 0)
    for item, grp, prt in extra:
        more_idx[fill[grp], grp] = item
        more_part[fill[grp], grp] = prt
        fill[grp] += 1
    return np.vstack((idx, more_idx)), np.vstack((part, more_part))
