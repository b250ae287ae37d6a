"""Workload models: what one sample costs, in tokens or in FLOPs."""

from __future__ import annotations

from collections.abc import Sequence


def flops_workloads(lengths: Sequence[int], linear: float, quadratic: float) -> list[float]:
    """FLOPs of each sequence as linear·L + quadratic·L² (dense matmuls plus causal attention)."""
    return [linear * n + quadratic * n * n for n in lengths]
