"""RolloutBatch: what one rollout hands to the scheduler and the trainer, per sample."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np

from slime_hydra.data.tokens import RolloutTokens, synthesize_tokens
from slime_hydra.errors import SlimeHydraError

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    """Per-sample lengths and rollout-group ids of one rollout (global sample indices 0..n-1).

    `step_ids`, when a source provides it, fixes which optimizer step each sample belongs to;
    otherwise steps are cut from whole groups in order. `tokens`, when a source provides it,
    holds the token-level data the trainer packs (data/tokens.py).
    """

    total_lengths: np.ndarray
    response_lengths: np.ndarray
    group_ids: np.ndarray
    step_ids: np.ndarray | None = None
    tokens: RolloutTokens | None = None

    def __post_init__(self) -> None:
        n = len(self.total_lengths)
        for name in ("response_lengths", "group_ids", "step_ids"):
            arr = getattr(self, name)
            if arr is not None and len(arr) != n:
                raise SlimeHydraError(
                    f"RolloutBatch: {name} has {len(arr)} entries for {n} samples."
                )
        bad = np.flatnonzero(self.response_lengths > self.total_lengths)
        if bad.size:
            i = int(bad[0])
            raise SlimeHydraError(
                f"RolloutBatch: sample {i} has response_length={int(self.response_lengths[i])} "
                f"longer than its total_length={int(self.total_lengths[i])}."
            )
        if self.tokens is not None and not (
            np.array_equal(self.tokens.total_lengths, self.total_lengths)
            and np.array_equal(self.tokens.response_lengths, self.response_lengths)
            and np.array_equal(self.tokens.group_ids, self.group_ids)
        ):
            raise SlimeHydraError(
                "RolloutBatch: the token data's lengths or group ids differ from the batch's; "
                "build the batch with RolloutBatch.from_tokens()."
            )

    @classmethod
    def from_tokens(cls, tokens: RolloutTokens) -> RolloutBatch:
        """The batch the scheduler reads (lengths, group ids), carrying these tokens."""
        return cls(
            total_lengths=tokens.total_lengths,
            response_lengths=tokens.response_lengths,
            group_ids=tokens.group_ids,
            tokens=tokens,
        )

    def __len__(self) -> int:
        return len(self.total_lengths)


def with_tokens(rollout: RolloutBatch, vocab_size: int, seed: int) -> RolloutBatch:
    """The rollout when it has tokens, else its lengths filled with the synthetic copy task."""
    if rollout.tokens is not None:
        return rollout
    log.info("The rollout has lengths only: synthesizing copy-task tokens (vocab %d)", vocab_size)
    tokens = synthesize_tokens(
        rollout.total_lengths, rollout.response_lengths, rollout.group_ids, vocab_size, seed
    )
    return dataclasses.replace(rollout, tokens=tokens)
