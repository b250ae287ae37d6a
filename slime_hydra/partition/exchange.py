"""One round of item exchanges between many pairs of bins at once (numpy, no Python per item).

For each pair (heavy bin h, light bin l) with a value gap g, the exchange is the move of an
item i from h to l, or the swap of i with an item j of l, whose value shift d = v_i - v_j lies
in (0, g) and within the light bin's room r, nearest min(g/2, r): the pair's heavier bin gets
lighter and the lighter one stays below where the heavier was. A move needs h to keep an
item; sizes must stay within the cap wherever a bin holds two or more items (a bin already
over it may only shrink). The light bins' items, with a zero-value stand-in for "move", are
sorted by (pair, value), so each heavy item finds its best partners by one binary search:
O((items in the pairs) log) work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from slime_hydra.partition.deal import ascending, ascending_by, run_starts

WINDOW = (-2, -1, 0, 1)  # candidates around the ideal partner: the two below and two above


def visits(heavy_items: Any, light_items: Any, n: int) -> Any:
    """The item visits `best_exchanges` charges for pairs whose heavy bins hold `heavy_items`
    (once per pair) and light bins `light_items` of `n` items in all: of ints an int, of
    arrays (running sums over the pairs) an array."""
    return heavy_items * len(WINDOW) + light_items + n // 8


def bulk_visits(heavy_items: Any, n: int) -> Any:
    """The item visits `bulk_moves` charges for pairs whose heavy bins hold `heavy_items`."""
    return heavy_items + n // 8


def _members(
    bin_of: np.ndarray, heavy: np.ndarray, light: np.ndarray, bins: int, movable: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The movable items of each pair's heavy bin with the pair (a heavy bin may be in several
    pairs: its items come once per pair), and of the light bins (distinct) with theirs: one
    gather over all items."""
    m = len(heavy)
    light_pair = np.full(bins, -1, dtype=np.int64)
    light_pair[light] = np.arange(m)
    is_heavy = np.zeros(bins, dtype=bool)
    is_heavy[heavy] = True
    of_light = light_pair[bin_of]
    li = np.flatnonzero((of_light >= 0) & movable)
    hi = np.flatnonzero(is_heavy[bin_of] & movable)
    hi = hi[ascending(bin_of[hi])]  # grouped by bin
    per_bin = np.bincount(bin_of[hi], minlength=bins)
    first = np.cumsum(per_bin) - per_bin
    count = per_bin[heavy]
    pair = np.repeat(np.arange(m), count)
    within = np.arange(pair.size) - np.repeat(np.cumsum(count) - count, count)
    return hi[first[heavy][pair] + within], pair, li, of_light[li]


@dataclass(frozen=True)
class Exchanges:
    """The chosen exchanges: bins, the item given by the heavy bin and the one it takes back
    (-1 for a move), and how many items were visited to find them."""

    heavy: np.ndarray
    light: np.ndarray
    give: np.ndarray
    take: np.ndarray
    visited: int

    @classmethod
    def none(cls, visited: int) -> Exchanges:
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, empty, empty, empty, visited)

    def shift(self, values: np.ndarray) -> np.ndarray:
        """What each exchange moves from the heavy to the light bin, in `values`."""
        back = np.where(self.take >= 0, values[np.maximum(self.take, 0)], 0)
        return values[self.give] - back


def best_exchanges(
    bin_of: np.ndarray,
    values: np.ndarray,
    sizes: np.ndarray,
    heavy: np.ndarray,
    light: np.ndarray,
    gap: np.ndarray,
    room: np.ndarray,
    size_load: np.ndarray,
    counts: np.ndarray,
    cap: int,
    movable: np.ndarray,
) -> Exchanges:
    """The best exchange of each heavy bin over its pairs (heavy[p], light[p]); light bins are
    distinct, a heavy bin may try several. `room[p]` bounds the shift besides `gap[p]`: what
    the light bin can take below its ceiling (the cap in a repair, the heaviest bin when
    evening groups). Of a heavy bin's pairs it takes the exchange that leaves the pair's
    heavier side lightest."""
    hi, p, li, pl = _members(bin_of, heavy, light, len(size_load), movable)
    visited = visits(hi.size, li.size, len(bin_of))
    if hi.size == 0:
        return Exchanges.none(visited)
    # Candidates in light bins, plus one zero-value stand-in per pair (a move), sorted by
    # (pair, value), a stand-in before the items of its value, the items by index.
    m = len(heavy)
    c_pair = np.concatenate((np.arange(m), pl))
    c_val = np.concatenate((np.zeros(m, dtype=values.dtype), values[li]))
    c_item = np.concatenate((np.full(m, -1, dtype=np.int64), li))
    x = values[hi]
    scale = max(int(c_val.max()), int(x.max(initial=0))) + 2
    key = c_pair * scale + c_val
    order = ascending(key)
    key, c_pair, c_val, c_item = key[order], c_pair[order], c_val[order], c_item[order]
    ideal = np.clip(x - np.minimum(gap[p] // 2, room[p]), 0, scale - 1)
    pos = np.searchsorted(key, p * scale + ideal, side="left")
    cand = pos[:, None] + np.asarray(WINDOW)[None, :]
    inside = (cand >= 0) & (cand < key.size)
    cand = np.clip(cand, 0, max(key.size - 1, 0))
    same = inside & (c_pair[cand] == p[:, None])
    d = x[:, None] - c_val[cand]
    ok = same & (d > 0) & (d < gap[p][:, None]) & (d <= room[p][:, None])
    j = c_item[cand]
    ok &= (j >= 0) | (counts[heavy[p]] > 1)[:, None]  # a move leaves the heavy bin an item
    pick = np.flatnonzero(ok.ravel())  # the candidates left, row by row
    row = pick // len(WINDOW)
    pair_of, shift, take = p[row], d.ravel()[pick], j.ravel()[pick]
    # Sizes stay within the cap where a bin holds two or more items (one over it may shrink).
    is_move = take < 0
    h_bin, l_bin = heavy[pair_of], light[pair_of]
    s_shift = shift if values is sizes else sizes[hi[row]] - np.where(is_move, 0, sizes[take])
    new_h = size_load[h_bin] - s_shift
    new_l = size_load[l_bin] + s_shift
    fits = (new_l <= cap) | (~is_move & (counts[l_bin] == 1))
    fits &= (new_h <= cap) | (new_h < size_load[h_bin]) | (~is_move & (counts[h_bin] == 1))
    pick, row, pair_of, shift, take = pick[fits], row[fits], pair_of[fits], shift[fits], take[fits]
    if pick.size == 0:
        return Exchanges.none(visited)
    err = np.abs(shift - np.minimum(gap[pair_of] // 2, room[pair_of]))
    best = ascending_by(pair_of, err)  # ties by `pick`, which is ascending
    first = best[run_starts(pair_of[best])]
    row, pairs, shift, take = row[first], pair_of[first], shift[first], take[first]  # one a pair
    kept = np.minimum(shift, gap[pairs] - shift)  # how far the pair's heavier side comes down
    by_bin = ascending_by(heavy[pairs], int(kept.max()) - kept)  # most kept first; ties by pair
    once = by_bin[run_starts(heavy[pairs][by_bin])]
    return Exchanges(
        heavy=heavy[pairs[once]],
        light=light[pairs[once]],
        give=hi[row[once]],
        take=take[once],
        visited=visited,
    )


def apply_exchanges(
    ex: Exchanges, bin_of: np.ndarray, sizes: np.ndarray, size_load: np.ndarray, counts: np.ndarray
) -> None:
    """Carry out `ex` in place: items change bins, bin sizes and item counts follow."""
    swap = ex.take >= 0
    bin_of[ex.give] = ex.light
    bin_of[ex.take[swap]] = ex.heavy[swap]
    s = ex.shift(sizes)
    np.subtract.at(size_load, ex.heavy, s)
    np.add.at(size_load, ex.light, s)
    moved = (~swap).astype(np.int64)
    np.subtract.at(counts, ex.heavy, moved)
    np.add.at(counts, ex.light, moved)


def bulk_moves(
    bin_of: np.ndarray,
    values: np.ndarray,
    sizes: np.ndarray,
    heavy: np.ndarray,
    light: np.ndarray,
    shift: np.ndarray,
    size_room: np.ndarray,
    counts: np.ndarray,
    movable: np.ndarray,
) -> Exchanges:
    """For each pair, the lightest items of the heavy bin, as many as move together at most
    `shift[p]` in value and `size_room[p]` in size, leaving the heavy bin at least one item:
    many small items at once where one exchange moves too little."""
    hi, p, _, _ = _members(bin_of, heavy, light, len(counts), movable)
    visited = bulk_visits(hi.size, len(bin_of))
    order = ascending_by(p, values[hi])  # ties by item: `_members` gives a pair's ascending
    hi, p = hi[order], p[order]
    starts = np.flatnonzero(run_starts(p))
    start = np.repeat(starts, np.diff(np.append(starts, p.size)))  # of each item's pair
    v_sum = np.cumsum(values[hi])
    s_sum = np.cumsum(sizes[hi])
    v_in = v_sum - np.where(start > 0, v_sum[start - 1], 0)
    s_in = s_sum - np.where(start > 0, s_sum[start - 1], 0)
    rank_in = np.arange(p.size) - start
    take = (v_in <= shift[p]) & (s_in <= size_room[p]) & (rank_in < counts[heavy[p]] - 1)
    give = hi[take]
    none = np.full(give.size, -1, dtype=np.int64)
    return Exchanges(heavy[p[take]], light[p[take]], give, none, visited)
