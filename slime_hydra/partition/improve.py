"""Improving a packing in place within a work budget: over-cap bins repaired, then the heaviest
bins lowered toward a goal.

`improve` is anytime: each pass pairs the bins above the goal, heaviest first, with the
lightest bins and applies, to every pair at once, the move or swap of one item whose shift
brings the pair nearest each other (`exchange.best_exchanges`). A pass never makes a bin
heavier than its pair's heavier bin was, nor a bin of two or more items break the cap, nor a
bin empty; over-cap bins are repaired first by the same exchanges on sizes, and what they leave
over the cap by partition.repair, whose passes search every bin with room. Passes run until
the heaviest bin is within the goal, no pair can improve, or the work budget (`Work`, counted
in item visits, so every machine plans the same) is spent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slime_hydra.partition.base import Work
from slime_hydra.partition.deal import ascending, descending
from slime_hydra.partition.exchange import Exchanges, apply_exchanges, best_exchanges, visits
from slime_hydra.partition.repair import repair

PARTNERS = 4
"""Light bins each heavy bin tries per pass (while the pool has that many per heavy bin); in
balancing, doubled after each pass in which the heaviest bin found no exchange (so it meets
every bin in O(log) passes, not one pass per PARTNERS bins: where the lightest bins cannot take
from it, e.g. micro-batches of two large samples beside three-sample ones, 12 fresh draws of
truncated 2k on dp4 took 8.1 -> 6.9 ms a step, the third family's worst 1.0111 -> 1.0063 of
its bound). In a repair only after a pass with no exchange at all: wider passes cost more for
the same gain, and `hopeless`, which reads that rate, gave up on a count the repair packs (16k
GRPO samples on dp64, 99.8% full); a pass in vain has no rate, and four partners a pass spent
a count search's budget (truncated 2k on dp4: 10.6 -> 6.3 ms a step, the same count).
On bench_planner's 48 cases of seed 11 the worst largest micro-batch over its
bound was 1.071 with 1 partner, 1.051 with 4 and 1.087 with 8 (the partners of the heaviest
bin spread wider)."""
HANDOVER = 0.25
"""A repair's paired passes stop once one removes less than this share of the excess over the
cap: what is left goes to partition.repair, whose passes search every bin with room. The paired
passes end most of a fresh start's excess fast (largest fit of 16k GRPO samples in 6,720
micro-batches: 938k -> 158k tokens over in five passes), then slow to 12-15% a pass where the
whole-step passes end the rest in three; run until their rate gave out, they took twice the
visits. On 456 lab steps (docs/planner.md, twenty-fourth round): 231 -> 230 micro-batches above
K_lb, the steps over 20 ms 4-6% faster; a share of 0.1: 232, 0.4: 230, 0.6: 235."""


def improve(
    bin_of: np.ndarray,
    sizes: np.ndarray,
    weights: np.ndarray,
    bins: int,
    cap: int,
    goal: float,
    work: Work,
) -> bool:
    """Repair over-cap bins (paired exchanges; where they stop short, partition.repair's
    whole-step passes), then lower the heaviest bins toward `goal`, in place, within `work`.
    Returns whether every bin of two or more items is within `cap`."""
    state = Packing.of(bin_of, sizes, weights, bins)
    if not _passes(state, sizes, cap, cap, work, repair=True):
        if not (work.left and repair(bin_of, sizes, bins, cap, work)):
            return False
        state = Packing.of(bin_of, sizes, weights, bins)
    _passes(state, weights, cap, goal, work, repair=False)
    return True


@dataclass
class Packing:
    """A packing and its per-bin totals, kept up to date by every exchange."""

    bin_of: np.ndarray
    sizes: np.ndarray
    weights: np.ndarray
    size_load: np.ndarray
    weight_load: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, bin_of: np.ndarray, sizes: np.ndarray, weights: np.ndarray, bins: int) -> Packing:
        """The packing `bin_of` (bins 0..bins-1) with its totals, counted once."""
        size_load = np.bincount(bin_of, weights=sizes, minlength=bins).astype(np.int64)
        weight_load = (
            size_load
            if weights is sizes
            else np.bincount(bin_of, weights=weights, minlength=bins).astype(np.int64)
        )
        counts = np.bincount(bin_of, minlength=bins)
        return cls(bin_of, sizes, weights, size_load, weight_load, counts)

    def load(self, values: np.ndarray) -> np.ndarray:
        """Each bin's total of `values` (the sizes or the weights)."""
        return self.size_load if values is self.sizes else self.weight_load

    def exchanges(
        self,
        values: np.ndarray,
        pairs: tuple[np.ndarray, np.ndarray],
        gap: np.ndarray,
        room: np.ndarray,
        cap: int,
        movable: np.ndarray,
    ) -> Exchanges:
        """`exchange.best_exchanges` over this packing for the (heavy, light) bin `pairs`."""
        heavy, light = pairs
        return best_exchanges(
            self.bin_of,
            values,
            self.sizes,
            heavy,
            light,
            gap,
            room,
            self.size_load,
            self.counts,
            cap,
            movable,
        )

    def apply(self, ex: Exchanges) -> None:
        """Carry out `ex` in place, the totals with it."""
        apply_exchanges(ex, self.bin_of, self.sizes, self.size_load, self.counts)
        if self.weight_load is not self.size_load:
            d = ex.shift(self.weights)
            np.subtract.at(self.weight_load, ex.heavy, d)
            np.add.at(self.weight_load, ex.light, d)


def _passes(
    state: Packing,
    values: np.ndarray,
    cap: int,
    goal: float,
    work: Work,
    repair: bool,
) -> bool:
    """Exchange passes on `values` until every open bin is at most `goal` (True), or no pair
    can improve or the work is spent (False); each pass takes only the pairs the work left pays
    for. In repair a bin of one item is done, and the passes stop once one removes less than
    HANDOVER of the excess. Both stop where the work left cannot remove the excess over `goal`
    at the last pass's rate (`hopeless`)."""
    load = state.load(values)
    n = len(state.bin_of)
    movable = np.ones(n, dtype=bool)
    stalled = stalls = 0  # partners the heaviest bin tried in vain: in all, and passes
    rotation = 0
    while True:
        over = load > goal
        if repair:
            over &= state.counts > 1
        heavy = np.flatnonzero(over)
        if heavy.size == 0:
            return True
        pool = np.flatnonzero(~over)
        if not work.left or pool.size == 0:
            return False
        heavy = heavy[descending(load[heavy])]  # ties by bin: flatnonzero is ascending
        pool = pool[ascending(load[pool])]
        m = min(heavy.size, pool.size)
        heavy = heavy[:m]
        tries = max(1, min(PARTNERS << min(stalls, 30), pool.size // m))
        light = pool[(np.arange(m * tries) + rotation) % pool.size]
        heavy = np.tile(heavy, tries)
        # Only the pairs the work left pays for, first partners first.
        paid = work.paid(visits(np.cumsum(state.counts[heavy]), np.cumsum(state.counts[light]), n))
        if paid == 0:
            return False
        heavy, light = heavy[:paid], light[:paid]
        excess = float((load[over] - goal).sum())
        spent = work.spent
        gap = load[heavy] - load[light]
        room = cap - load[light] if repair else gap
        ex = state.exchanges(values, (heavy, light), gap, room, cap, movable)
        work.charge(ex.visited)
        top_moved = bool((ex.heavy == heavy[0]).any())
        if ex.give.size:
            state.apply(ex)
            if hopeless(load[over], goal, excess, work, work.spent - spent):
                return False
            if repair and float(np.maximum(load[over] - goal, 0).sum()) > (1 - HANDOVER) * excess:
                return False  # partition.repair's whole-step passes go on from here
        if top_moved:
            stalled = stalls = 0
        else:  # the heaviest bin found no exchange: it tries the next bins, in balancing
            # twice as many each time; a repair only after a pass with no exchange at all
            # (otherwise it keeps its pace: `hopeless` reads its rate)
            stalls += not repair or ex.give.size == 0
            stalled += m * tries
            rotation += m * tries
            if stalled >= pool.size:
                return False


def hopeless(was_over: np.ndarray, goal: float, excess: float, work: Work, cost: int) -> bool:
    """Whether the passes cannot end within their budget at the rate of the pass just made,
    which cost `cost` visits and started from `excess` over `goal` in the bins whose loads are
    now `was_over`: the budget left, spent at that rate, removes less than the excess left.
    Passes only slow down as the easy exchanges are made, so this stops a repair of a count
    that it cannot pack, or balancing that cannot reach its goal (a step of full bins), after
    a few passes, not after its whole budget."""
    left = float(np.maximum(was_over - goal, 0).sum())
    return work.outpaced(left, excess - left, cost)
