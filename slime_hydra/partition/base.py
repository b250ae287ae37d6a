"""Shared types of the partition library: the Partitioner protocol and its failure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

Parts = list[list[int]]


class PartitionError(ValueError):
    """No partition satisfies the constraints (the caller adds the user-facing context)."""


class Partitioner(Protocol):
    """Splits item indices into non-empty parts, each within `cap`, with the count constrained.

    The count K returned satisfies K >= min_parts and (K + offset) % align == 0; among such K the
    smallest one the partitioner can fill is expected, with the largest part as small as it can,
    though balancing below `floor` (a part the caller already has elsewhere) buys nothing.
    `sizes`, when given, are what `cap` limits and `weights` what is balanced (FLOPs balance);
    the caller passes it only then.
    """

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
    ) -> Parts: ...


def align_up(k: int, align: int, offset: int = 0) -> int:
    """Smallest k' >= k with (k' + offset) divisible by align."""
    return k + (-(k + offset)) % align


def part_sums(parts: Parts, weights: Sequence[int]) -> list[int]:
    """Total weight of each part."""
    return [sum(weights[i] for i in part) for part in parts]
