"""Random families of rollout lengths, for the planner's property tests and its benchmark
(benchmarks/bench_planner.py): every family draws its own shape from the generator it is given,
so a fresh seed gives lengths nobody tuned the planner to."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Family = Callable[[np.random.Generator, int, int], np.ndarray]


def grpo(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """GRPO groups: a prompt shared by 4-16 samples, lognormal responses (median and spread
    drawn), cut at the max response length."""
    group = int(rng.choice([4, 8, 16]))
    prompt = rng.integers(32, max(33, cap // 16), -(-n // group)).repeat(group)[:n]
    median = rng.uniform(0.02, 0.4) * cap
    response = rng.lognormal(np.log(median), rng.uniform(0.3, 1.3), n)
    return prompt + np.minimum(response, cap - prompt).astype(np.int64)


def truncated(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """Reasoning traces: uniform lengths with a spike (20-60%) at the max length."""
    top = int(cap * rng.uniform(0.2, 1.0))
    lengths = rng.integers(64, max(65, top), n)
    lengths[rng.random(n) < rng.uniform(0.2, 0.6)] = top
    return lengths


def pareto(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """Heavy tails: Pareto lengths (shape 1.1-2.5), at most the cap."""
    scale = rng.uniform(0.005, 0.05) * cap
    return np.minimum(16 + rng.pareto(rng.uniform(1.1, 2.5), n) * scale, cap).astype(np.int64)


def short(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """Short answers: uniform in a narrow band of a few hundred tokens."""
    low = int(rng.integers(8, 64))
    return rng.integers(low, low + int(rng.integers(16, 400)), n)


def over_half(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """Just over cap/2 (each needs a micro-batch of its own) mixed with small ones."""
    big = rng.random(n) < rng.uniform(0.1, 0.6)
    return np.where(
        big, rng.integers(cap // 2 + 1, int(cap * 0.6), n), rng.integers(16, cap // 8, n)
    )


def equal(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """All samples of one length."""
    return np.full(n, int(rng.integers(16, cap + 1)), dtype=np.int64)


def third(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """Around cap/3: three fit a micro-batch only when they are small enough."""
    return rng.integers(int(cap * 0.28), int(cap * 0.36), n)


def oversize(rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """Tiny samples and a few (0.2-2%) over the cap (needs batching.oversize=isolate)."""
    lengths = rng.integers(8, 256, n)
    over = rng.choice(n, max(1, int(n * rng.uniform(0.002, 0.02))), replace=False)
    lengths[over] = rng.integers(cap + 1, 2 * cap, over.size)
    return lengths


FAMILIES: dict[str, Family] = {
    "grpo": grpo,
    "truncated": truncated,
    "pareto": pareto,
    "short": short,
    "over_half": over_half,
    "equal": equal,
    "third": third,
    "oversize": oversize,
}
ISOLATE = frozenset({"oversize"})
"""Families with samples over the cap: planned with batching.oversize=isolate."""


def lengths_of(family: str, rng: np.random.Generator, n: int, cap: int) -> np.ndarray:
    """n lengths (each >= 1) of the named family under a cap of `cap` tokens."""
    return np.maximum(FAMILIES[family](rng, n, cap), 1).astype(np.int64)
