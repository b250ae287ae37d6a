"""Random token-level rollouts shared by the packing and iterator tests."""

from __future__ import annotations

import numpy as np

from slime_hydra.data.tokens import RolloutTokens


def random_tokens(seed: int, n: int, max_len: int, with_logprobs: bool = True) -> RolloutTokens:
    """Random rollout tokens with random masks and per-token values, prompts possibly empty."""
    rng = np.random.default_rng(seed)
    total = rng.integers(1, max_len + 1, n)
    resp = rng.integers(0, total + 1)
    return RolloutTokens.from_samples(
        tokens=[rng.integers(1, 1000, t) for t in total],
        response_lengths=resp,
        loss_masks=[rng.random(r) < 0.7 for r in resp],
        rewards=rng.random(n),
        group_ids=np.arange(n) // 3,
        advantages=[rng.normal(size=r) for r in resp],
        old_logprobs=[-rng.random(r) for r in resp] if with_logprobs else None,
    )
