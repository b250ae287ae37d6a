"""MicrobatchIterator: one DP rank's micro-batches of one optimizer step, packed THD on demand.

It is the `iterator` config group's object: the app instantiates it partially from
`conf/iterator/` (its own keys, e.g. `pad_multiple`), and the training engine completes it per
rank and step with the runtime arguments (rollout, the rank's micro-batches, step, DP rank,
TP and CP sizes, CP rank). A replacement (`iterator._target_=my_pkg.MyIterator`) takes the
same constructor and offers what the engine uses: `len()`, a fresh pass of `PackedMicrobatch`es
per `iter()` (one per VPP chunk) and `seq_length()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError

if TYPE_CHECKING:  # packing imports torch and megatron: seconds that plan mode never needs
    from slime_hydra.data.packing import PackedMicrobatch


def padding(pad_multiple: int | None, tp_size: int, cp_size: int) -> int:
    """The packed-length multiple `iterator.pad_multiple` asks for (None: tp × 128), checked:
    positive, and even under context parallelism (the padding splits into 2×cp chunks)."""
    multiple = tp_size * 128 if pad_multiple is None else pad_multiple
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise SlimeHydraError(
            f"iterator.pad_multiple={multiple!r} must be a positive number of tokens "
            "(or null for tp × 128)."
        )
    if cp_size > 1 and multiple % 2:
        raise SlimeHydraError(
            f"iterator.pad_multiple={multiple} must be even with parallel.cp={cp_size}, so the "
            "padding splits into 2×cp chunks like every sequence: set "
            f"iterator.pad_multiple={2 * multiple}."
        )
    return multiple


class MicrobatchIterator(Iterable["PackedMicrobatch"]):
    """A rank's micro-batches of one step in schedule order, each packed once for this CP rank.

    Every `iter()` is a fresh pass: megatron's interleaved schedule gets one per VPP chunk, and
    all passes share one packing of each micro-batch. The schedule is checked when the object
    is built, before any packing. `pad_multiple=None` pads to tp × 128 tokens (what TE's
    kernels and sequence parallelism want); the CP layout is the zig-zag of TE's THD kernels.
    `step` is the step's number as users read it (from 1), named in errors.
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
        if not 0 <= cp_rank < cp_size:
            raise SlimeHydraError(
                f"MicrobatchIterator: cp_rank={cp_rank} is outside [0, cp_size={cp_size})."
            )
        self.pad_multiple = padding(pad_multiple, tp_size, cp_size)
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
        self._packed: list[PackedMicrobatch | None] = [None] * len(self._microbatches)

    def __len__(self) -> int:
        return len(self._microbatches)

    def __getitem__(self, m: int) -> PackedMicrobatch:
        """Micro-batch m, packed on first use and kept for the other passes."""
        packed = self._packed[m]
        if packed is None:
            from slime_hydra.data.packing import pack_microbatch

            packed = pack_microbatch(
                self._tokens,
                self._microbatches[m],
                pad_multiple=self.pad_multiple,
                cp_size=self.cp_size,
                cp_rank=self.cp_rank,
            )
            self._packed[m] = packed
        return packed

    def __iter__(self) -> Iterator[PackedMicrobatch]:
        return (self[m] for m in range(len(self)))

    def seq_length(self) -> int:
        """The longest packed micro-batch over the whole CP group (megatron's `seq_length`),
        from the sample lengths alone, without packing."""
        unit = 2 * self.cp_size if self.cp_size > 1 else 1
        longest = 0
        for idx in self._microbatches:
            lengths = self._tokens.total_lengths[idx]
            local = int((-(-lengths // unit) * unit).sum()) // self.cp_size
            longest = max(longest, local + -local % self.pad_multiple)
        return longest * self.cp_size
