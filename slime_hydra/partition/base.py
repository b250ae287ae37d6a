"""Shared types of the partition library: the Partitioner protocol, its work budget, its failure."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

Parts = list[list[int]]


class PartitionError(ValueError):
    """No partition satisfies the constraints (the caller adds the user-facing context)."""


PASS_OVERHEAD = 5000
"""A pass's fixed cost in item visits: its ~60 numpy calls take ~250 µs (measured on small
steps), the time of about 5,000 item visits."""


@dataclass
class Work:
    """Improvement work allowed and spent, in item visits (deterministic, unlike a clock: every
    rank that plans the same step stops at the same point)."""

    budget: int
    spent: int = 0

    @staticmethod
    def cost(visits: int, passes: int = 1) -> int:
        """What `passes` passes (numpy passes over a step: PASS_OVERHEAD each) that visit
        `visits` items in all cost."""
        return visits + passes * PASS_OVERHEAD

    def charge(self, visits: int, passes: int = 1) -> None:
        """Count `passes` passes that visited `visits` items in all (`cost`)."""
        self.spent += self.cost(visits, passes)

    @property
    def left(self) -> bool:
        return self.spent < self.budget

    @property
    def remaining(self) -> int:
        """The visits not yet spent."""
        return max(self.budget - self.spent, 0)

    @contextmanager
    def part(self, visits: int) -> Iterator[Work]:
        """At most `visits` of what is left, as a budget of its own for one piece of work;
        what that spends is spent here."""
        sub = Work(self.spent + min(max(visits, 0), self.remaining), self.spent)
        try:
            yield sub
        finally:
            self.spent = sub.spent

    def affords(self, visits: int, passes: int = 1) -> bool:
        """Whether `passes` passes of `visits` item visits in all fit in what is left."""
        return self.spent + self.cost(visits, passes) <= self.budget

    def pay(self, visits: int, passes: int = 1) -> bool:
        """Charge `passes` passes of `visits` item visits in all if they fit in what is left;
        whether they did (work that is not paid for is not started)."""
        if not self.affords(visits, passes):
            return False
        self.charge(visits, passes)
        return True

    def outpaced(self, left: float, cut: float, cost: int) -> bool:
        """Whether work that removed `cut` (of an excess, > 0) for `cost` visits cannot remove
        the `left` still there with what is left, at that rate."""
        return cut > 0 and left * cost > cut * (self.budget - self.spent)

    def paid(self, running: np.ndarray, passes: int = 1) -> int:
        """How many of a pass's pairs, in order, what is left pays for: `running` is the
        visits of its first 1, 2, ... pairs (ascending), `passes` the searches it charges."""
        return int(
            np.searchsorted(running, self.budget - self.spent - passes * PASS_OVERHEAD, "right")
        )


class Partitioner(Protocol):
    """Packs items into the first bin count of `counts` (ascending) it can: non-empty bins,
    each of two or more items within `cap` (sizes), as even in `weights` as `work` allows;
    returns the count and the bin of each item, or None. Dynamic batching's partitioner
    (batching.partitioner); `tolerance`, `budget`, `budget_per_sample`,
    `repair_budget_per_sample` and `group_items` are its settings."""

    tolerance: float
    budget: int
    budget_per_sample: int
    repair_budget_per_sample: int
    group_items: int

    def __call__(
        self,
        sizes: np.ndarray,
        weights: np.ndarray,
        counts: Sequence[int],
        cap: int,
        work: Work,
    ) -> tuple[int, np.ndarray] | None: ...


def align_up(k: int, align: int, offset: int = 0) -> int:
    """Smallest k' >= k with (k' + offset) divisible by align."""
    return k + (-(k + offset)) % align


def part_sums(parts: Parts, weights: Sequence[int]) -> list[int]:
    """Total weight of each part."""
    return [sum(weights[i] for i in part) for part in parts]
