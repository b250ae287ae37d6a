"""Dynamic batching: the fewest micro-batches under max_tokens_per_gpu × cp, balanced across DP.

Balance objective (`balance`): `tokens`, or `flops` (a sequence costs a·L + b·L², a and b from
the model dims); the token cap is a hard limit for both.

Two ways to split a step across DP ranks:
- `kk`: split samples across ranks by equal-count Karmarkar-Karp, then partition each rank into
  the common K;
- `pack`: partition the whole step into dp·K cap-safe parts, then deal K parts to each rank by
  equal-count Karmarkar-Karp on part cost. Its in-order first-fit fallback guarantees it never
  needs more micro-batches than a pack-first scheduler.
`auto` (the default) plans `kk` and keeps it when its K is the lower bound on K, its heaviest
micro-batch is within the partitioner's tolerance of a proven lower bound on the heaviest
micro-batch at that K (partition.bounds), and its ranks are within that tolerance of each
other; otherwise it also plans `pack` and keeps the better by score: fewer micro-batches, then
the worse of micro-batch and rank imbalance (within the tolerance counted as equal), then rank
imbalance.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition import CappedPartitioner, Partitioner, PartitionError, karmarkar_karp
from slime_hydra.partition.bounds import max_part_lower_bound
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


class Balance(StrEnum):
    """What micro-batches and ranks are balanced by."""

    tokens = "tokens"
    flops = "flops"


Weights = Sequence[int] | dict[int, int]


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
        balance: Balance | str = Balance.tokens,
        flops_coefficients: tuple[float, float] | None = None,
    ) -> None:
        if max_tokens_per_gpu is None:
            raise SlimeHydraError(
                "batching=dynamic needs batching.max_tokens_per_gpu (tokens per GPU per "
                "micro-batch); set it, e.g. batching.max_tokens_per_gpu=8192."
            )
        super().__init__(layout, global_batch_size, max_tokens_per_gpu, flops_coefficients)
        self.oversize = Oversize(oversize)
        self.dp_split = DpSplit(dp_split)
        self.partitioner: Partitioner = partitioner or CappedPartitioner()
        self.balance = Balance(balance)
        if self.balance is Balance.flops and flops_coefficients is None:
            raise SlimeHydraError(
                "batching.balance=flops needs the model's FLOPs per sequence (a·L + b·L², from "
                "the model group); build the strategy through the config, or set "
                "batching.balance=tokens."
            )
        self.tolerance: float = getattr(self.partitioner, "tolerance", 0.01)

    def weights(self, lengths: Sequence[int], samples: Sequence[int]) -> Weights:
        """What balancing flattens, by global sample index: tokens, or a·L + b·L² FLOPs."""
        if self.balance is Balance.tokens:
            return lengths
        assert self.flops_coefficients is not None
        a, b = self.flops_coefficients
        return {i: int(a * lengths[i] + b * lengths[i] * lengths[i]) for i in samples}

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
        w = self.weights(lengths, samples)
        k_lb = microbatch_lower_bound(
            [lengths[i] for i in samples], cap, self.layout.dp, self.layout.microbatch_alignment
        )
        planners = {DpSplit.kk: self._split_then_pack, DpSplit.pack: self._pack_then_deal}
        candidates: list[RankMicrobatches] = []
        failures: list[PartitionError] = []
        for split in (DpSplit.kk, DpSplit.pack):
            if self.dp_split not in (DpSplit.auto, split):
                continue
            if candidates and self._near_bound(candidates[0], lengths, w, k_lb):
                break
            try:
                candidates.append(planners[split](lengths, samples, w))
            except PartitionError as exc:
                failures.append(exc)
        if not candidates:
            raise self._infeasible(lengths, samples, w, step, failures[0])
        return _best(candidates, w, self.tolerance)

    def _infeasible(
        self,
        lengths: Sequence[int],
        samples: list[int],
        w: Weights,
        step: int,
        failure: PartitionError,
    ) -> SlimeHydraError:
        """The error for a step no split planned; under dp_split=kk it names auto when the
        pack split would have planned it."""
        if self.dp_split is DpSplit.kk:
            try:
                self._pack_then_deal(lengths, samples, w)
            except PartitionError:
                pass
            else:
                return SlimeHydraError(
                    f"{where(step)}batching.dp_split=kk splits samples across ranks first, and "
                    f"that split cannot give parallel.dp={self.layout.dp} ranks the same number "
                    f"of non-empty micro-batches under the cap of {self.cap} tokens ({failure}); "
                    "set batching.dp_split=auto (the default), which plans this step by packing "
                    "it whole."
                )
        g = self.layout.microbatch_alignment
        return SlimeHydraError(
            f"{where(step)}{len(samples)} samples cannot fill parallel.dp={self.layout.dp} "
            f"ranks with the same number of non-empty micro-batches (a multiple of {g}) "
            f"under the cap of {self.cap} tokens ({failure}); raise "
            "batching.global_batch_size, or lower parallel.dp or "
            "parallel.microbatch_group_size_per_vp_stage."
        )

    def _near_bound(
        self, ranks: RankMicrobatches, lengths: Sequence[int], w: Weights, k_lb: int
    ) -> bool:
        """Whether no other split can score better by more than the tolerance: K at its lower
        bound, the heaviest micro-batch within tolerance of the proven bound at K, ranks within
        tolerance of each other."""
        k = len(ranks[0])
        if k != k_lb:
            return False
        cap = self.cap
        assert cap is not None
        tol = 1 + self.tolerance
        rank_w = [sum(w[i] for mb in rank for i in mb) for rank in ranks]
        if max(rank_w) * len(rank_w) > tol * sum(rank_w):
            return False
        normal = [mb for rank in ranks for mb in rank if len(mb) > 1 or lengths[mb[0]] <= cap]
        bins = len(ranks) * k - (sum(len(rank) for rank in ranks) - len(normal))
        if not normal or bins < 1:
            return True
        mb_w = [sum(w[i] for i in mb) for mb in normal]
        top = max(mb_w)
        items = [w[i] for mb in normal for i in mb]
        return top <= tol * max_part_lower_bound(items, bins, upper=top, rel_tol=self.tolerance / 8)

    def _pack(
        self,
        ids: list[int],
        lengths: Sequence[int],
        w: Weights,
        align: int,
        min_count: int,
        floor: int,
    ) -> list:
        """Cap-safe micro-batches of `ids`, count >= min_count and a multiple of `align`,
        balanced by `w`; samples over the cap (only present under oversize=isolate) each sit
        alone. `floor` is the step's heaviest micro-batch-to-be (in `w`), below which balancing
        buys nothing."""
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
        sizes = {} if w is lengths else {"sizes": [lengths[i] for i in normal]}
        parts = self.partitioner(
            [w[i] for i in normal],
            cap,
            align=align,
            offset=len(over),
            min_parts=max(1, min_count - len(over)),
            floor=floor,
            **sizes,
        )
        return [[normal[j] for j in part] for part in parts] + over

    def _pack_then_deal(
        self, lengths: Sequence[int], samples: list[int], w: Weights
    ) -> RankMicrobatches:
        """Partition the step into dp·K parts, then deal K parts to each rank."""
        dp = self.layout.dp
        # floor 0: parts as even as possible, so that dealing K of them evens the ranks too.
        parts = self._pack(samples, lengths, w, dp * self.layout.microbatch_alignment, dp, 0)
        cost = [sum(w[i] for i in part) for part in parts]
        return [
            [parts[p] for p in sorted(deal, key=lambda p: -cost[p])]
            for deal in karmarkar_karp(cost, dp, equal_size=True)
        ]

    def _split_then_pack(
        self, lengths: Sequence[int], samples: list[int], w: Weights
    ) -> RankMicrobatches:
        """Split samples across ranks by equal-count KK, then pack each rank into a common K."""
        g = self.layout.microbatch_alignment
        rank_ids = [
            [samples[j] for j in part]
            for part in karmarkar_karp([w[i] for i in samples], self.layout.dp, True)
        ]
        # Ranks are even already; a micro-batch can be no lighter than the heaviest sample.
        cap = self.cap
        assert cap is not None
        floor = max((w[i] for i in samples if lengths[i] <= cap), default=0)
        packed = [self._pack(ids, lengths, w, g, 1, floor) for ids in rank_ids]
        k = max(len(mbs) for mbs in packed)
        while any(len(mbs) != k for mbs in packed):
            packed = [
                mbs if len(mbs) == k else self._pack(ids, lengths, w, g, k, floor)
                for ids, mbs in zip(rank_ids, packed, strict=True)
            ]
            k = max(len(mbs) for mbs in packed)
        return packed


def _best(candidates: list[RankMicrobatches], w: Weights, tolerance: float) -> RankMicrobatches:
    """The candidate of least score, where micro-batch/rank imbalances within `tolerance` of
    the best count as equal, so that rank imbalance (a straggler) decides between them."""
    scores = [_score(ranks, w) for ranks in candidates]
    k = min(score[0] for score in scores)
    worst = min(score[1] for score in scores if score[0] == k) * (1 + tolerance)
    eligible = [i for i, score in enumerate(scores) if score[0] == k and score[1] <= worst]
    return candidates[min(eligible, key=lambda i: (scores[i][2], scores[i][1]))]


def _score(ranks: RankMicrobatches, w: Weights) -> tuple[int, float, float]:
    """Fewer micro-batches per rank, then the worse of micro-batch and rank imbalance, then
    the rank imbalance (a straggler costs every rank); imbalance in the balanced cost."""
    mb_cost = [sum(w[i] for i in mb) for rank in ranks for mb in rank]
    rank_cost = [sum(w[i] for mb in rank for i in mb) for rank in ranks]
    mb_imb = max(mb_cost) * len(mb_cost) / sum(mb_cost)
    rank_imb = max(rank_cost) * len(rank_cost) / sum(rank_cost)
    return len(ranks[0]), max(mb_imb, rank_imb), rank_imb
