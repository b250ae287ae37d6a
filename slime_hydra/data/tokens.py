"""Token-level rollout data in flat buffers, GRPO advantages, and a synthetic verifiable task.

Layout: one flat buffer per field plus offsets, not one tensor per sample. At 4,096 samples of
up to 8k tokens (17M tokens) benchmarks/bench_iterator.py measured 221 MiB vs 235 MiB, 8 arrays
vs 16,384 tensors, and a 2-4x faster build; packing was 15-30% slower than a cp=1-only
torch.cat packer (about 1 ms per 16k-token micro-batch, negligible next to a training step),
and the flat layout also gives vectorised sources and one gather per field for any CP split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from slime_hydra.errors import SlimeHydraError

PAD_ID = 0
SEP_ID = 1
DIGIT0_ID = 2
NUM_DIGITS = 10


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Exclusive prefix sums [0, l0, l0+l1, ...]: where each sample starts in a flat buffer."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@dataclass(frozen=True, eq=False)
class RolloutTokens:
    """Per-sample tokens and response-level training signals of one rollout, in flat buffers.

    Sample i's tokens are `tokens[offsets[i]:offsets[i+1]]`; its last `response_lengths[i]`
    tokens are the response. `loss_mask`, `advantages` and `old_logprobs` hold one value per
    response token, sample i's at `response_offsets[i]:response_offsets[i+1]`.
    `old_logprobs` is None when the source has no rollout log-probs (the trainer recomputes them).
    """

    tokens: np.ndarray
    offsets: np.ndarray
    response_lengths: np.ndarray
    loss_mask: np.ndarray
    advantages: np.ndarray
    old_logprobs: np.ndarray | None
    rewards: np.ndarray
    group_ids: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.offsets) - 1
        if n < 1 or self.offsets[0] != 0 or np.any(np.diff(self.offsets) <= 0):
            raise SlimeHydraError(
                "RolloutTokens: offsets must start at 0 and grow by at least one token per sample."
            )
        if self.offsets[-1] != len(self.tokens):
            raise SlimeHydraError(
                f"RolloutTokens: offsets end at {int(self.offsets[-1])} "
                f"but the token buffer holds {len(self.tokens)} tokens."
            )
        for name in ("response_lengths", "rewards", "group_ids"):
            if len(getattr(self, name)) != n:
                raise SlimeHydraError(
                    f"RolloutTokens: {name} has {len(getattr(self, name))} entries for {n} samples."
                )
        bad = np.flatnonzero(
            (self.response_lengths < 0) | (self.response_lengths > self.total_lengths)
        )
        if bad.size:
            i = int(bad[0])
            raise SlimeHydraError(
                f"RolloutTokens: sample {i} has response_length={int(self.response_lengths[i])} "
                f"outside [0, total_length={int(self.total_lengths[i])}]."
            )
        num_response = int(self.response_offsets[-1])
        for name in ("loss_mask", "advantages", "old_logprobs"):
            arr = getattr(self, name)
            if arr is not None and len(arr) != num_response:
                raise SlimeHydraError(
                    f"RolloutTokens: {name} has {len(arr)} values "
                    f"for {num_response} response tokens."
                )

    @classmethod
    def from_samples(
        cls,
        tokens: Sequence[Sequence[int] | np.ndarray],
        response_lengths: Sequence[int],
        loss_masks: Sequence[Sequence[float] | np.ndarray],
        rewards: Sequence[float],
        group_ids: Sequence[int],
        advantages: Sequence[float | Sequence[float] | np.ndarray] | None = None,
        old_logprobs: Sequence[Sequence[float] | np.ndarray] | None = None,
    ) -> RolloutTokens:
        """Build from per-sample lists; an advantage is one value per sample or per response token.

        Without `advantages`, GRPO advantages are computed from the rewards within each group.
        """
        resp = np.asarray(response_lengths, dtype=np.int64)
        rew = np.asarray(rewards, dtype=np.float32)
        gids = np.asarray(group_ids, dtype=np.int64)
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
        flat_tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
        if advantages is None:
            advantages = grpo_advantages(rew, gids)
        flat_adv = np.concatenate(
            [
                np.broadcast_to(np.asarray(a, dtype=np.float32), (r,))
                for a, r in zip(advantages, resp, strict=True)
            ]
        )
        flat_mask = np.concatenate([np.asarray(m, dtype=bool) for m in loss_masks])
        flat_logp = (
            None
            if old_logprobs is None
            else np.concatenate([np.asarray(lp, dtype=np.float32) for lp in old_logprobs])
        )
        return cls(
            tokens=flat_tokens,
            offsets=_offsets(lengths),
            response_lengths=resp,
            loss_mask=flat_mask,
            advantages=flat_adv,
            old_logprobs=flat_logp,
            rewards=rew,
            group_ids=gids,
        )

    def __len__(self) -> int:
        return len(self.response_lengths)

    @cached_property
    def total_lengths(self) -> np.ndarray:
        """Tokens per sample (prompt + response)."""
        return np.diff(self.offsets)

    @cached_property
    def response_offsets(self) -> np.ndarray:
        """Start of each sample's values in the per-response-token buffers."""
        return _offsets(self.response_lengths)

    @cached_property
    def loss_mask_cumsum(self) -> np.ndarray:
        """Prefix sums of the loss mask, so a packer counts loss tokens without touching them."""
        return _offsets(self.loss_mask.astype(np.int64))

    def sample(self, i: int) -> dict[str, np.ndarray | None]:
        """Views of sample i's tokens and per-response-token values, for checks and debugging."""
        t0, t1 = self.offsets[i], self.offsets[i + 1]
        r0, r1 = self.response_offsets[i], self.response_offsets[i + 1]
        return {
            "tokens": self.tokens[t0:t1],
            "loss_mask": self.loss_mask[r0:r1],
            "advantages": self.advantages[r0:r1],
            "old_logprobs": None if self.old_logprobs is None else self.old_logprobs[r0:r1],
        }


def grpo_advantages(rewards: np.ndarray, group_ids: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO advantage per sample: (reward - group mean) / (group std + eps), population std.

    The population std keeps a group of one sample defined (advantage 0) instead of NaN.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    _, inverse, counts = np.unique(group_ids, return_inverse=True, return_counts=True)
    mean = np.bincount(inverse, weights=rewards) / counts
    centred = rewards - mean[inverse]
    std = np.sqrt(np.bincount(inverse, weights=centred * centred) / counts)
    return (centred / (std[inverse] + eps)).astype(np.float32)


def synthesize_tokens(
    total_lengths: np.ndarray,
    response_lengths: np.ndarray,
    group_ids: np.ndarray,
    vocab_size: int,
    seed: int,
) -> RolloutTokens:
    """Tokens of a copy task a tiny GPT can learn, with noisy responses and GRPO advantages.

    The prompt is random digits then SEP; the right response repeats the prompt's digits
    cyclically. Each sample's responses are wrong per token with its own noise rate, so
    rewards (fraction of right tokens) vary within a group; the old log-prob is the noise
    model's log-probability of the sampled token. Same inputs and seed, same output.
    """
    if vocab_size < DIGIT0_ID + NUM_DIGITS:
        raise SlimeHydraError(
            f"synthesize_tokens: vocab_size={vocab_size} is too small; the copy task needs "
            f"{DIGIT0_ID + NUM_DIGITS} ids (pad, sep, ten digits). Raise model.vocab_size."
        )
    total = np.asarray(total_lengths, dtype=np.int64)
    resp = np.asarray(response_lengths, dtype=np.int64)
    n = len(total)
    rng = np.random.default_rng(seed)
    offsets = _offsets(total)
    num_tokens = int(offsets[-1])
    prompt = total - resp
    sid = np.repeat(np.arange(n), total)
    pos = np.arange(num_tokens, dtype=np.int64) - offsets[sid]
    p = prompt[sid]
    tokens = DIGIT0_ID + rng.integers(0, NUM_DIGITS, size=num_tokens, dtype=np.int64)
    tokens[pos == p - 1] = SEP_ID

    in_resp = pos >= p
    r_sid = sid[in_resp]
    j = pos[in_resp] - p[in_resp]
    num_prompt_digits = np.maximum(prompt - 1, 1)[r_sid]
    source = offsets[r_sid] + j % num_prompt_digits
    target = np.where(prompt[r_sid] >= 2, tokens[source], DIGIT0_ID)

    noise = rng.uniform(0.05, 0.6, size=n)
    eps = noise[r_sid]
    correct = rng.random(len(r_sid)) >= eps
    shift = rng.integers(1, NUM_DIGITS, size=len(r_sid), dtype=np.int64)
    wrong = DIGIT0_ID + (target - DIGIT0_ID + shift) % NUM_DIGITS
    tokens[in_resp] = np.where(correct, target, wrong)
    old_logprobs = np.where(correct, np.log1p(-eps), np.log(eps / (NUM_DIGITS - 1)))

    right = np.diff(_offsets(correct.astype(np.int64))[_offsets(resp)])
    rewards = (right / np.maximum(resp, 1)).astype(np.float32)
    gids = np.asarray(group_ids, dtype=np.int64)
    return RolloutTokens(
        tokens=tokens,
        offsets=offsets,
        response_lengths=resp,
        loss_mask=np.ones(len(r_sid), dtype=bool),
        advantages=np.repeat(grpo_advantages(rewards, gids), resp),
        old_logprobs=old_logprobs.astype(np.float32),
        rewards=rewards,
        group_ids=gids,
    )
