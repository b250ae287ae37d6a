"""Dynamic batching: the fewest micro-batches under max_tokens_per_gpu × cp, balanced across DP.

Two ways to split a step across DP ranks:
- `kk`: split samples across ranks by equal-count Karmarkar-Karp on lengths, then partition
  each rank into the common K;
- `pack`: partition the whole step into dp·K cap-safe parts, then deal K parts to each rank by
  equal-count Karmarkar-Karp on part tokens. Its in-order first-fit fallback guarantees it
  never needs more micro-batches than a pack-first scheduler.
`auto` (the default) plans `kk` and keeps it when it reaches the lower bound on K, which is
the common case (benchmarks/bench_schedule.py); otherwise it also plans `pack` and keeps the
better: fewer micro-batches, then flatter micro-batch and rank loads, then flatter ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition import CappedPartitioner, Partitioner, PartitionError, karmarkar_karp
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.metrics import microbatch_lower_bound
from slime_hydra.schedule.strategy import BatchingStrategy, RankMicrobatches, where


class Oversize(StrEnum):
    """What to do with a sample longer than the cap on its own."""

    error = "error"
    isolate = "isolate"


class DpSplit(StrEnum):
    """How a step's samples are split across DP ranks."""

    auto = "auto"
    pack = "pack"
    kk = "kk"


class DynamicBatching(BatchingStrategy):
    """Cap-safe, VPP-aligned, DP-balanced micro-batches with one count for all ranks."""

    def __init__(
        self,
        layout: ParallelLayout,
        global_batch_size: int | None,
        max_tokens_per_gpu: int,
        oversize: Oversize | str = Oversize.error,
        dp_split: DpSplit | str = DpSplit.auto,
        partitioner: Partitioner | None = None,
    ) -> None:
        if max_tokens_per_gpu is None:
            raise SlimeHydraError(
                "batching=dynamic needs batching.max_tokens_per_gpu (tokens per GPU per "
                "micro-batch); set it, e.g. batching.max_tokens_per_gpu=8192."
            )
        super().__init__(layout, global_batch_size, max_tokens_per_gpu)
        self.oversize = Oversize(oversize)
        self.dp_split = DpSplit(dp_split)
        self.partitioner: Partitioner = partitioner or CappedPartitioner()

    @property
    def isolates_oversize(self) -> bool:
        return self.oversize is Oversize.isolate

    def plan_step(self, lengths: Sequence[int], samples: list[int], step: int) -> RankMicrobatches:
        cap = self.cap
        assert cap is not None
        if self.oversize is Oversize.error:
            for i in samples:
                if lengths[i] > cap:
                    raise SlimeHydraError(
                        f"{where(step)}sample {i} has {lengths[i]} tokens, over the cap of "
                        f"{cap} tokens per micro-batch (batching.max_tokens_per_gpu="
                        f"{self.max_tokens_per_gpu} × parallel.cp={self.layout.cp}); raise "
                        "batching.max_tokens_per_gpu, or set batching.oversize=isolate to train "
                        "it alone in its own micro-batch."
                    )
        candidates: list[RankMicrobatches] = []
        failures: list[PartitionError] = []
        lower_bound = microbatch_lower_bound(
            [lengths[i] for i in samples], cap, self.layout.dp, self.layout.microbatch_alignment
        )
        for split, planner in (
            (DpSplit.kk, self._split_then_pack),
            (DpSplit.pack, self._pack_then_deal),
        ):
            if self.dp_split not in (DpSplit.auto, split):
                continue
            if candidates and len(candidates[0][0]) == lower_bound:
                break
            try:
                candidates.append(planner(lengths, samples))
            except PartitionError as exc:
                failures.append(exc)
        if not candidates:
            g = self.layout.microbatch_alignment
            raise SlimeHydraError(
                f"{where(step)}{len(samples)} samples cannot fill parallel.dp={self.layout.dp} "
                f"ranks with the same number of non-empty micro-batches (a multiple of {g}) "
                f"under the cap of {cap} tokens ({failures[0]}); raise "
                "batching.global_batch_size, or lower parallel.dp or "
                "parallel.microbatch_group_size_per_vp_stage."
            )
        return min(candidates, key=lambda ranks: _score(ranks, lengths))

    def _pack(
        self, ids: list[int], lengths: Sequence[int], align: int, min_count: int, floor: int
    ) -> list:
        """Cap-safe micro-batches of `ids`, count >= min_count and a multiple of `align`;
        samples over the cap (only present under oversize=isolate) each sit alone. `floor` is
        the step's heaviest micro-batch-to-be, below which balancing buys nothing."""
        cap = self.cap
        assert cap is not None
        over = [[i] for i in ids if lengths[i] > cap]
        normal = [i for i in ids if lengths[i] <= cap]
        if not normal:
            if len(over) < min_count or len(over) % align:
                raise PartitionError(
                    f"{len(over)} over-cap samples alone cannot make {min_count} or more "
                    f"micro-batches in multiples of {align}"
                )
            return over
        parts = self.partitioner(
            [lengths[i] for i in normal],
            cap,
            align=align,
            offset=len(over),
            min_parts=max(1, min_count - len(over)),
            floor=floor,
        )
        return [[normal[j] for j in part] for part in parts] + over

    def _pack_then_deal(self, lengths: Sequence[int], samples: list[int]) -> RankMicrobatches:
        """Partition the step into dp·K parts, then deal K parts to each rank."""
        dp = self.layout.dp
        # floor 0: parts as even as possible, so that dealing K of them evens the ranks too.
        parts = self._pack(samples, lengths, dp * self.layout.microbatch_alignment, dp, 0)
        tokens = [sum(lengths[i] for i in part) for part in parts]
        return [
            [parts[p] for p in sorted(deal, key=lambda p: -tokens[p])]
            for deal in karmarkar_karp(tokens, dp, equal_size=True)
        ]

    def _split_then_pack(self, lengths: Sequence[int], samples: list[int]) -> RankMicrobatches:
        """Split samples across ranks by equal-count KK, then pack each rank into a common K."""
        g = self.layout.microbatch_alignment
        rank_ids = [
            [samples[j] for j in part]
            for part in karmarkar_karp([lengths[i] for i in samples], self.layout.dp, True)
        ]
        # Ranks are even already; a micro-batch can be no lighter than the longest sample.
        floor = max((lengths[i] for i in samples if lengths[i] <= self.cap), default=0)
        packed = [self._pack(ids, lengths, g, 1, floor) for ids in rank_ids]
        k = max(len(mbs) for mbs in packed)
        while any(len(mbs) != k for mbs in packed):
            packed = [
                mbs if len(mbs) == k else self._pack(ids, lengths, g, k, floor)
                for ids, mbs in zip(rank_ids, packed, strict=True)
            ]
            k = max(len(mbs) for mbs in packed)
        return packed


def _score(ranks: RankMicrobatches, lengths: Sequence[int]) -> tuple[int, float, float]:
    """Fewer micro-batches per rank, then the worse of micro-batch and rank imbalance, then
    the rank imbalance (a straggler costs every rank)."""
    mb_tokens = [sum(lengths[i] for i in mb) for rank in ranks for mb in rank]
    rank_tokens = [sum(lengths[i] for mb in rank for i in mb) for rank in ranks]
    mb_imb = max(mb_tokens) * len(mb_tokens) / sum(mb_tokens)
    rank_imb = max(rank_tokens) * len(rank_tokens) / sum(rank_tokens)
    return len(ranks[0]), max(mb_imb, rank_imb), rank_imb
