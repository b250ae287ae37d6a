"""MicrobatchIterator: one DP rank's micro-batches of one optimizer step, packed THD on demand."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from slime_hydra.data.packing import PackedMicrobatch, pack_microbatch
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError


class MicrobatchIterator(Iterator[PackedMicrobatch]):
    """Yields a rank's micro-batches in schedule order, each packed for this CP rank.

    Megatron's forward-backward calls `next()` on it; with VPP each model chunk gets its own
    iterator over the same micro-batches, or one iterator is `reset()` to replay them.
    The schedule is checked when the iterator is built, before any packing.
    """

    def __init__(
        self,
        batch: RolloutBatch,
        microbatches: Sequence[Sequence[int]],
        *,
        step: int,
        dp_rank: int,
        tp_size: int = 1,
        pad_multiple: int | None = None,
        cp_size: int = 1,
        cp_rank: int = 0,
    ) -> None:
        if batch.tokens is None:
            raise SlimeHydraError(
                "MicrobatchIterator: the RolloutBatch has no token data; training needs a source "
                "that provides tokens (data=synthetic_grpo or data=slime_dump), not lengths only."
            )
        self.pad_multiple = tp_size * 128 if pad_multiple is None else pad_multiple
        if self.pad_multiple < 1:
            raise SlimeHydraError(
                f"MicrobatchIterator: pad_multiple={self.pad_multiple} must be a positive integer."
            )
        if not 0 <= cp_rank < cp_size:
            raise SlimeHydraError(
                f"MicrobatchIterator: cp_rank={cp_rank} is outside [0, cp_size={cp_size})."
            )
        if cp_size > 1 and self.pad_multiple % 2:
            raise SlimeHydraError(
                f"MicrobatchIterator: pad_multiple={self.pad_multiple} must be even with "
                f"cp_size={cp_size}, so the padding splits into 2×cp chunks like every sequence."
            )
        where = f"step {step}, DP rank {dp_rank}"
        n = len(batch)
        self._microbatches: list[np.ndarray] = []
        for m, mb in enumerate(microbatches):
            idx = np.asarray(mb, dtype=np.int64)
            if idx.size == 0:
                raise SlimeHydraError(
                    f"Schedule {where}: micro-batch {m} is empty; a micro-batch needs at least one "
                    "sample (a legacy preset such as batching=slime_1823 can leave empty ones)."
                )
            bad = idx[(idx < 0) | (idx >= n)]
            if bad.size:
                raise SlimeHydraError(
                    f"Schedule {where}: micro-batch {m} holds sample index {int(bad[0])}, "
                    f"outside the rollout's {n} samples [0, {n})."
                )
            self._microbatches.append(idx)
        self._tokens = batch.tokens
        self.cp_size = cp_size
        self.cp_rank = cp_rank
        self._next = 0

    def __len__(self) -> int:
        return len(self._microbatches)

    def __iter__(self) -> MicrobatchIterator:
        return self

    def __next__(self) -> PackedMicrobatch:
        if self._next == len(self._microbatches):
            raise StopIteration
        idx = self._microbatches[self._next]
        self._next += 1
        return pack_microbatch(
            self._tokens,
            idx,
            pad_multiple=self.pad_multiple,
            cp_size=self.cp_size,
            cp_rank=self.cp_rank,
        )

    def reset(self) -> None:
        """Start again from the first micro-batch (VPP replays the same ones per model chunk)."""
        self._next = 0
