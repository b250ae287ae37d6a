"""`get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)`, the call slime and
verl share, on slime_hydra's Karmarkar-Karp (partition.karmarkar_karp)."""

from __future__ import annotations

from collections.abc import Sequence

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition import karmarkar_karp


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """`k_partitions` lists of indices into `seqlen_list`, each sorted and non-empty, every index
    in exactly one, their sums balanced by Karmarkar-Karp; with `equal_size`, every list holds
    len(seqlen_list) / k_partitions indices. The peers' contract, with two differences: a
    violated precondition raises SlimeHydraError (a ValueError) where they raise
    AssertionError, and where differencing leaves a part empty (zero-length items) the lightest
    item of the fullest part moves into it where they raise "the i-th partition is empty"."""
    n, k = len(seqlen_list), k_partitions
    if k < 1 or n < k:
        raise SlimeHydraError(
            f"get_seqlen_balanced_partitions: {n} items cannot fill k_partitions={k} non-empty "
            f"partitions; pass k_partitions between 1 and {max(n, 1)}."
        )
    if equal_size and n % k:
        raise SlimeHydraError(
            f"get_seqlen_balanced_partitions: equal_size=True needs len(seqlen_list)={n} to be "
            f"a multiple of k_partitions={k}; pass equal_size=False or a divisor of {n}."
        )
    weights = [int(x) for x in seqlen_list]
    parts = karmarkar_karp(weights, k, equal_size)
    for empty in [p for p in parts if not p]:
        fullest = max(parts, key=len)
        lightest = min(fullest, key=lambda i: (weights[i], i))
        fullest.remove(lightest)
        empty.append(lightest)
    return [sorted(p) for p in parts]
