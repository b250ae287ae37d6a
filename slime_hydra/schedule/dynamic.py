"""Dynamic batching: the fewest micro-batches under max_tokens_per_gpu × cp, balanced across DP.

Balance objective (`balance`): `tokens`, or `flops` (a sequence costs a·L + b·L², a and b from
the model dims); the token cap is a hard limit for both.

Two ways to split a step across DP ranks:
- `kk`: deal samples to ranks in rounds, heaviest first (partition.batched.split_even: equal
  counts, even cost, and each rank the same share of the long samples that need micro-batches
  of their own), then pack every rank into the common K, from the lower bound on K upwards;
  for many ranks all at once with numpy (LPT or best-fit decreasing), a rank that does not fit
  that way by the partitioner alone;
- `pack`: partition the whole step into dp·K cap-safe parts, deal K parts to each rank, even
  the ranks. First by first-fit decreasing at K = K_lb (its overflow, if a few bins, repacked
  by minimum bin slack: partition.slack), the parts dealt by split_even; if that is not near
  the bound, by the partitioner, the parts dealt by equal-count Karmarkar-Karp on part cost,
  then swaps between the micro-batches of the heaviest and lightest ranks (within the cap, no
  micro-batch above the heaviest) until ranks are within a quarter of the tolerance. Its
  in-order first-fit fallback guarantees it never needs more micro-batches than a pack-first
  scheduler.
K_lb is one micro-batch per over-cap sample plus Martello-Toth's L2 bound on the bins the rest
need (partition.bounds), over dp, aligned.
`auto` (the default) tries the cheap planners first and keeps the first plan near the bound:
the kk split when numpy fits all but 1/8 of the ranks into K_lb, then the whole-step first-fit
decreasing and the full kk split (FFD first for a near-full step, where packing each rank alone
tends to need one micro-batch more), then the partitioner's pack. Near the bound means
K = K_lb, the heaviest micro-batch within the partitioner's tolerance of a lower bound on it at
that K (the mean and the largest sample first, the proven bound of partition.bounds only if
those are missed), and ranks within that tolerance of each other. If none is, it keeps the
best by score: fewer micro-batches, then the worse of micro-batch and rank imbalance (within
the tolerance counted as equal), then rank imbalance.

Internally a step's samples are numbered 0..n-1 (arrays of sizes and weights); global sample
indices come back only in the returned micro-batches. FLOPs weights are scaled so that the
step's costliest sample weighs 2^30 (integers, no overflow, ratios kept).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from itertools import chain, islice

import numpy as np

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition import CappedPartitioner, Partitioner, PartitionError, karmarkar_karp
from slime_hydra.partition.base import align_up
from slime_hydra.partition.batched import (
    descending,
    pack_groups,
    place_spilled,
    split_even,
    worth_batching,
)
from slime_hydra.partition.bounds import max_part_lower_bound
from slime_hydra.partition.capped import refine
from slime_hydra.partition.greedy import first_fit_decreasing
from slime_hydra.partition.slack import repack_overflow
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.metrics import microbatch_lower_bound
from slime_hydra.schedule.strategy import BatchingStrategy, RankMicrobatches, where

FLOPS_SCALE = 1 << 30  # the costliest sample's weight under balance=flops
RANK_SWAP_ROUNDS = 256  # exchanges between ranks after the pack split, at most
QUICK_ALONE = 8  # the quick kk split packs at most 1/8 of the ranks one by one


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


@dataclass
class _Step:
    """One step's samples in local numbering 0..n-1: global ids, tokens, balanced weights."""

    samples: list[int]
    sizes: np.ndarray
    weights: np.ndarray
    cap: int

    @cached_property
    def size_list(self) -> list[int]:
        return self.sizes.tolist()

    @cached_property
    def weight_list(self) -> list[int]:
        if self.weights is self.sizes:
            return self.size_list
        return self.weights.tolist()

    @cached_property
    def over(self) -> np.ndarray:
        """Whether each sample is over the cap (alone in its micro-batch under isolate)."""
        return self.sizes > self.cap


Local = list[list[list[int]]]  # per rank, per micro-batch, local sample numbers


@dataclass
class _Plan:
    """A step's micro-batches as arrays: local sample numbers rank by rank, micro-batch by
    micro-batch (`flat`), and the samples in each micro-batch (`counts`, dp × K)."""

    flat: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, ranks: Local) -> _Plan:
        mbs = list(chain.from_iterable(ranks))
        counts = np.fromiter(map(len, mbs), dtype=np.int64, count=len(mbs))
        flat = np.fromiter(chain.from_iterable(mbs), dtype=np.int64, count=int(counts.sum()))
        return cls(flat, counts.reshape(len(ranks), -1))

    @property
    def k(self) -> int:
        return self.counts.shape[1]

    def starts(self) -> np.ndarray:
        counts = self.counts.ravel()
        return np.concatenate(([0], np.cumsum(counts)[:-1]))

    def mb_weights(self, weights: np.ndarray) -> np.ndarray:
        """Total weight of each micro-batch (dp × K); micro-batches are never empty."""
        return np.add.reduceat(weights[self.flat], self.starts()).reshape(self.counts.shape)

    def nested(self, ids: np.ndarray | None = None) -> Local:
        """Per rank, per micro-batch lists of local numbers, or of `ids[local]`."""
        flat = (self.flat if ids is None else ids[self.flat]).tolist()
        it = iter(flat)
        k = self.k
        mbs = [list(islice(it, c)) for c in self.counts.ravel().tolist()]
        return [mbs[r * k : (r + 1) * k] for r in range(self.counts.shape[0])]


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

    def weights(self, sizes: np.ndarray) -> np.ndarray:
        """What balancing flattens: tokens, or a·L + b·L² FLOPs scaled so that the costliest
        sample weighs FLOPS_SCALE (integers; a ratio of costs is kept to about 1e-9)."""
        if self.balance is Balance.tokens:
            return sizes
        assert self.flops_coefficients is not None
        a, b = self.flops_coefficients
        length = sizes.astype(np.float64)
        cost = a * length + b * length * length
        top = float(cost.max()) if cost.size else 0.0
        if top <= 0:
            return sizes
        return np.maximum(np.rint(cost * (FLOPS_SCALE / top)), 1).astype(np.int64)

    @property
    def isolates_oversize(self) -> bool:
        return self.oversize is Oversize.isolate

    def plan_step(self, lengths: Sequence[int], samples: list[int], step: int) -> RankMicrobatches:
        cap = self.cap
        assert cap is not None
        sizes = np.fromiter((lengths[i] for i in samples), dtype=np.int64, count=len(samples))
        if self.oversize is Oversize.error and sizes.size and int(sizes.max()) > cap:
            i = samples[int(sizes.argmax())]
            raise SlimeHydraError(
                f"{where(step)}sample {i} has {lengths[i]} tokens, over the cap of "
                f"{cap} tokens per micro-batch (batching.max_tokens_per_gpu="
                f"{self.max_tokens_per_gpu} × parallel.cp={self.layout.cp}); raise "
                "batching.max_tokens_per_gpu, or set batching.oversize=isolate to train "
                "it alone in its own micro-batch."
            )
        st = _Step(list(samples), sizes, self.weights(sizes), cap)
        k_lb = self._k_lower_bound(st)
        planned: dict[Callable[[_Step, int], _Plan | None], _Plan] = {}
        failures: list[PartitionError] = []
        for planner in self._planners(st, k_lb):
            if planner == self._split_then_pack and self._quick_split in planned:
                continue  # the same plan again
            try:
                plan = planner(st, k_lb)
            except PartitionError as exc:
                failures.append(exc)
                continue
            if plan is None:
                continue
            if self._near_bound(plan, st, k_lb):
                planned = {planner: plan}
                break
            planned[planner] = plan
        if not planned:
            raise self._infeasible(st, k_lb, step, failures[0])
        candidates = list(planned.values())
        best = candidates[0] if len(candidates) == 1 else _best(candidates, st, self.tolerance)
        return best.nested(np.asarray(st.samples, dtype=np.int64))

    def _planners(self, st: _Step, k_lb: int) -> list[Callable[[_Step, int], _Plan | None]]:
        """The planners `dp_split` tries, in order, until one is near the bound: the cheap ones
        first. The quick kk split (at K_lb, few ranks packed one by one), then for a near-full
        step (the mean micro-batch at K_lb within half the tolerance of the cap, where packing
        each rank alone tends to need one more) the whole-step first-fit decreasing before
        the full kk split, else after it; the partitioner's pack last."""
        if self.dp_split is DpSplit.kk:
            return [self._split_then_pack]
        if self.dp_split is DpSplit.pack:
            return [self._fill_then_deal, self._pack_then_deal]
        full = int(st.sizes.sum()) >= (1 - self.tolerance / 2) * self.layout.dp * k_lb * st.cap
        middle = [self._fill_then_deal, self._split_then_pack]
        return [self._quick_split, *(middle if full else middle[::-1]), self._pack_then_deal]

    def _k_lower_bound(self, st: _Step) -> int:
        """Fewest micro-batches per rank (schedule.metrics.microbatch_lower_bound)."""
        return microbatch_lower_bound(
            st.sizes, st.cap, self.layout.dp, self.layout.microbatch_alignment
        )

    def _infeasible(
        self, st: _Step, k_lb: int, step: int, failure: PartitionError
    ) -> SlimeHydraError:
        """The error for a step no split planned; under dp_split=kk it names auto when the
        pack split would have planned it."""
        if self.dp_split is DpSplit.kk:
            try:
                self._pack_then_deal(st, k_lb)
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
            f"{where(step)}{len(st.samples)} samples cannot fill parallel.dp={self.layout.dp} "
            f"ranks with the same number of non-empty micro-batches (a multiple of {g}) "
            f"under the cap of {self.cap} tokens ({failure}); raise "
            "batching.global_batch_size, or lower parallel.dp or "
            "parallel.microbatch_group_size_per_vp_stage."
        )

    def _near_bound(self, plan: _Plan, st: _Step, k_lb: int) -> bool:
        """Whether no other split can score better by more than the tolerance: K at its lower
        bound, the heaviest micro-batch within tolerance of a lower bound at K (mean and
        largest sample first, the proven bound only if needed), ranks within tolerance of
        each other."""
        if plan.k != k_lb:
            return False
        tol = 1 + self.tolerance
        mb_w = plan.mb_weights(st.weights)
        rank_w = mb_w.sum(1)
        if rank_w.max() * len(rank_w) > tol * rank_w.sum():
            return False
        mb_w = mb_w.ravel()
        normal = ~((plan.counts.ravel() == 1) & st.over[plan.flat[plan.starts()]])
        bins = int(normal.sum())
        items = st.weights[~st.over]
        if bins < 1 or items.size == 0:
            return True
        top = int(mb_w[normal].max())
        cheap = max(int(items.max()), -(-int(items.sum()) // bins))
        if top <= tol * cheap:
            return True
        bound = max_part_lower_bound(items, bins, upper=top, rel_tol=self.tolerance / 8)
        return top <= tol * bound

    def _pack(
        self, ids: list[int], st: _Step, align: int, min_count: int, floor: int
    ) -> list[list[int]]:
        """Cap-safe micro-batches of local samples `ids`, count >= min_count and a multiple of
        `align`, balanced by weight; samples over the cap (only present under
        oversize=isolate) each sit alone. `floor` is the step's heaviest micro-batch-to-be, below
        which balancing buys nothing."""
        cap = st.cap
        sizes, weights = st.size_list, st.weight_list
        over = [[i] for i in ids if sizes[i] > cap]
        normal = [i for i in ids if sizes[i] <= cap]
        if not normal:
            if len(over) < min_count or len(over) % align:
                raise PartitionError(
                    f"{len(over)} over-cap samples alone cannot make {min_count} or more "
                    f"micro-batches in multiples of {align}"
                )
            return over
        extra = {} if weights is sizes else {"sizes": [sizes[i] for i in normal]}
        parts = self.partitioner(
            [weights[i] for i in normal],
            cap,
            align=align,
            offset=len(over),
            min_parts=max(1, min_count - len(over)),
            floor=floor,
            **extra,
        )
        return [[normal[j] for j in part] for part in parts] + over

    def _pack_then_deal(self, st: _Step, k_lb: int) -> _Plan:
        """Partition the step into dp·K parts, deal K parts to each rank, even the ranks."""
        del k_lb
        dp = self.layout.dp
        ids = list(range(len(st.samples)))
        # floor 0: parts as even as possible, so that dealing K of them evens the ranks too.
        parts = self._pack(ids, st, dp * self.layout.microbatch_alignment, dp, 0)
        weights = st.weight_list
        cost = [sum(weights[i] for i in part) for part in parts]
        ranks = [
            [parts[p] for p in sorted(deal, key=lambda p: -cost[p])]
            for deal in karmarkar_karp(cost, dp, equal_size=True)
        ]
        even_ranks(ranks, st.size_list, weights, st.cap, self.tolerance / 4)
        return _Plan.of(ranks)

    def _fill_then_deal(self, st: _Step, k: int) -> _Plan | None:
        """dp·K micro-batches by first-fit decreasing over the whole step (over-cap samples
        alone; a few bins too many repaired by partition.slack.repack_overflow), dealt K to
        each rank by partition.batched.split_even on their weights, then `even_ranks` if ranks
        are still more than a quarter of the tolerance apart; None if that needs more
        bins or the step has too few samples. The near-full case: the bins are nearly full,
        so they are balanced already, and packing the step whole reaches K where packing
        each rank alone needs one more."""
        dp = self.layout.dp
        over = np.flatnonzero(st.over)
        normal = np.flatnonzero(~st.over)
        bins = dp * k - over.size
        if bins < 1 or normal.size < bins:
            return None
        bin_of = repack_overflow(
            st.sizes[normal], st.cap, first_fit_decreasing(st.sizes[normal], st.cap), bins
        )
        if bin_of is None:
            return None
        counts = np.bincount(bin_of, minlength=bins)
        if not counts.all():  # the heaviest samples not first in their bin fill empty bins
            first = np.zeros(normal.size, dtype=bool)
            first[np.unique(bin_of, return_index=True)[1]] = True
            movable = np.flatnonzero(~first)
            empty = np.flatnonzero(counts == 0)
            movable = movable[descending(st.weights[normal[movable]])][: empty.size]
            bin_of[movable] = empty
        local = np.concatenate((normal, over))
        bin_of = np.concatenate((bin_of, np.arange(bins, bins + over.size)))
        bin_w = np.bincount(bin_of, weights=st.weights[local]).astype(np.int64)
        deal = split_even(bin_w, dp, self.tolerance / 4)
        rank_of = np.empty(dp * k, dtype=np.int64)
        slot_of = np.empty(dp * k, dtype=np.int64)
        rank_of[deal] = np.arange(dp)[None, :]
        slot_of[deal] = np.arange(k)[:, None]
        key = rank_of[bin_of] * k + slot_of[bin_of]
        plan = self._finish(key, local, st, k, 0)
        rank_w = plan.mb_weights(st.weights).sum(1)
        if rank_w.max() * dp <= (1 + self.tolerance / 4) * rank_w.sum():
            return plan
        ranks = plan.nested()  # FFD's bins are uneven in FLOPs: dealing alone may not even them
        even_ranks(ranks, st.size_list, st.weight_list, st.cap, self.tolerance / 4)
        return _Plan.of(ranks)

    def _quick_split(self, st: _Step, k_lb: int) -> _Plan | None:
        """The kk split where numpy fits all ranks but a few into K_lb and the partitioner the
        rest (`_pack_ranks_together` with `quick`); None otherwise."""
        return self._split_then_pack(st, k_lb, quick=True)

    def _split_then_pack(self, st: _Step, k_lb: int, quick: bool = False) -> _Plan | None:
        """Deal samples to ranks in rounds, then pack every rank into a common K; with
        `quick`, only at K_lb and with few ranks packed alone (else None)."""
        dp = self.layout.dp
        g = self.layout.microbatch_alignment
        cols = split_even(st.weights, dp, self.tolerance / 4)
        # A micro-batch can be no lighter than the heaviest sample (ranks are even already).
        normal = st.weights[~st.over]
        floor = int(normal.max()) if normal.size else 0
        fast = (
            isinstance(self.partitioner, CappedPartitioner)
            and not st.over.any()
            and worth_batching(dp, cols.shape[0], k_lb)
        )
        if fast:
            return self._pack_ranks_together(cols, st, k_lb, floor, quick)
        if quick:
            return None
        rank_ids = [[j for j in col if j >= 0] for col in cols.T.tolist()]
        packed = [self._pack(ids, st, g, 1, floor) for ids in rank_ids]
        k = max(len(mbs) for mbs in packed)
        while any(len(mbs) != k for mbs in packed):
            packed = [
                mbs if len(mbs) == k else self._pack(ids, st, g, k, floor)
                for ids, mbs in zip(rank_ids, packed, strict=True)
            ]
            k = max(len(mbs) for mbs in packed)
        return _Plan.of(packed)

    def _pack_ranks_together(
        self, cols: np.ndarray, st: _Step, k: int, floor: int, quick: bool = False
    ) -> _Plan | None:
        """Every rank into the same K parts at once (partition.batched.pack_groups); a rank
        that neither LPT nor best-fit fits goes to the partitioner alone, and K rises (in steps
        of the VPP alignment) until every rank fits. Ranks whose heaviest part is above the
        tolerance of the bound are then refined one by one. With `quick`, None instead where K
        would rise or over 1/QUICK_ALONE of the ranks would go alone (the near-full case, which
        `_fill_then_deal` plans faster)."""
        g = self.layout.microbatch_alignment
        dp = self.layout.dp
        cap = st.cap
        rounds = cols.shape[0]
        valid = cols >= 0
        while True:
            if k > rounds:
                raise PartitionError(
                    f"a rank's {rounds} or fewer samples cannot fill {k} non-empty micro-batches"
                )
            mean = -(-int(st.sizes.sum()) // (dp * k))
            tight = max(int(st.sizes.max()), mean) * (1 + self.tolerance) >= cap
            part = np.zeros_like(cols)
            room = np.zeros((dp, k), dtype=np.int64)
            ok = np.zeros(dp, dtype=bool)
            for best_fit in (tight, not tight):
                todo = np.flatnonzero(~ok)
                if todo.size == 0:
                    break
                got, left = pack_groups(cols[:, todo], st.sizes, st.weights, k, cap, best_fit)
                done = _all_parts_filled(got, valid[:, todo] & (got >= 0), k)
                if not best_fit:
                    done &= (left >= 0).all(1)
                part[:, todo[done]] = got[:, done]
                room[todo[done]] = left[done]
                ok[todo[done]] = True
            placed = place_spilled(cols, np.where(ok[None, :], part, 0), room, st.sizes)
            if placed is None:  # ranks that spilled go to the partitioner alone
                ok &= ~((part < 0) & valid).any(0)
                placed = cols, np.maximum(part, 0)
            new_cols, new_part = placed
            if quick and (~ok).sum() * QUICK_ALONE > dp:
                return None
            alone: dict[int, list[list[int]]] = {}
            need = k
            for r in np.flatnonzero(~ok).tolist():
                ids = [j for j in cols[:, r].tolist() if j >= 0]
                parts = self._pack(ids, st, 1, k, floor)
                alone[r] = parts
                need = max(need, len(parts))
            if need == k:
                cols, part = new_cols, new_part
                break
            if quick:
                return None
            k = align_up(need, g)
        return self._assemble(cols, part, alone, st, k, floor)

    def _assemble(
        self,
        cols: np.ndarray,
        part: np.ndarray,
        alone: dict[int, list[list[int]]],
        st: _Step,
        k: int,
        floor: int,
    ) -> _Plan:
        """The plan from the part matrix (and the ranks packed alone), refined by `_finish`."""
        dp = self.layout.dp
        if alone:  # those ranks' columns: their parts from the partitioner, in order
            cols = cols.copy()
            part = part.copy()
            for r, parts in alone.items():
                members = [i for p, mb in enumerate(parts) for i in mb]
                where_ = [p for p, mb in enumerate(parts) for _ in mb]
                cols[:, r] = -1
                cols[: len(members), r] = members
                part[: len(members), r] = where_
        valid = cols >= 0
        key = (np.arange(dp) * k)[None, :] + part
        return self._finish(key[valid], cols[valid], st, k, floor)

    def _finish(self, key: np.ndarray, local: np.ndarray, st: _Step, k: int, floor: int) -> _Plan:
        """The plan of samples `local` in micro-batches `key` (rank·K + slot), after refining
        the ranks whose heaviest part is above (1 + tolerance) × a lower bound on the step's
        heaviest part at dp·K: the largest sample and the mean first, the proven bound if
        missed."""
        dp = self.layout.dp
        order = np.lexsort((local, key))
        counts = np.bincount(key, minlength=dp * k).reshape(dp, k)
        plan = _Plan(local[order], counts)
        mb_w = np.bincount(key, weights=st.weights[local], minlength=dp * k)
        total = int(st.weights.sum())
        goal = int(max(floor, int(st.weights.max()), -(-total // (dp * k))) * (1 + self.tolerance))
        top = float(mb_w.max())
        if top <= goal:
            return plan
        bound = max_part_lower_bound(st.weights, dp * k, upper=int(top), rel_tol=self.tolerance / 8)
        goal = max(goal, int(bound * (1 + self.tolerance)))
        if top <= goal:
            return plan
        rounds = getattr(self.partitioner, "refine_rounds", None) or 4 * k
        weights, sizes = st.weight_list, st.size_list
        ranks = plan.nested()
        heavy = mb_w.reshape(dp, k).max(1) > goal
        for r in np.flatnonzero(heavy).tolist():
            rank = ranks[r]
            sums = [sum(weights[i] for i in mb) for mb in rank]
            loads = sums if weights is sizes else [sum(sizes[i] for i in mb) for mb in rank]
            refine(rank, sums, weights, goal, 4 * rounds, sizes, loads, st.cap)
        return _Plan.of(ranks)


def _all_parts_filled(part: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    """Per group (column), whether every one of its k parts got an item."""
    groups = part.shape[1]
    key = (np.arange(groups) * k)[None, :] + part
    filled = np.bincount(key[valid], minlength=groups * k).reshape(groups, k)
    return (filled > 0).all(1)


def even_ranks(
    ranks: Local, sizes: Sequence[int], weights: Sequence[int], cap: int, tolerance: float
) -> None:
    """Move or swap samples between micro-batches of the heaviest and the lightest rank, in
    place, until the heaviest rank is within `tolerance` of the mean or no exchange helps.

    An exchange keeps every micro-batch of two or more samples within `cap` (sizes), leaves no
    micro-batch empty, makes no micro-batch heavier than the heaviest one before, and its
    weight shift d lies in (0, gap) between the two ranks, nearest gap/2."""
    dp = len(ranks)
    if dp < 2:
        return
    mb_w = [[sum(weights[i] for i in mb) for mb in rank] for rank in ranks]
    mb_s = [[sum(sizes[i] for i in mb) for mb in rank] for rank in ranks]
    rank_w = [sum(ws) for ws in mb_w]
    total = sum(rank_w)
    ceiling = max(max(ws) for ws in mb_w)
    for _ in range(RANK_SWAP_ROUNDS):
        p = max(range(dp), key=rank_w.__getitem__)
        q = min(range(dp), key=rank_w.__getitem__)
        gap = rank_w[p] - rank_w[q]
        if gap <= 0 or rank_w[p] * dp <= (1 + tolerance) * total:
            return
        move = _rank_exchange(ranks, mb_w, mb_s, p, q, gap, sizes, weights, cap, ceiling)
        if move is None:
            return
        a, i, b, j, d = move
        ranks[p][a].remove(i)
        ranks[q][b].append(i)
        shift = sizes[i]
        if j is not None:
            ranks[q][b].remove(j)
            ranks[p][a].append(j)
            shift -= sizes[j]
        mb_w[p][a] -= d
        mb_w[q][b] += d
        mb_s[p][a] -= shift
        mb_s[q][b] += shift
        rank_w[p] -= d
        rank_w[q] += d


def _rank_exchange(
    ranks: Local,
    mb_w: list[list[int]],
    mb_s: list[list[int]],
    p: int,
    q: int,
    gap: int,
    sizes: Sequence[int],
    weights: Sequence[int],
    cap: int,
    ceiling: int,
) -> tuple[int, int, int, int | None, int] | None:
    """The best move (a, i, b, None, d) or swap (a, i, b, j, d) of sample i in rank p's
    micro-batch a with rank q's micro-batch b (and its sample j), per `even_ranks`."""
    theirs = sorted(
        ((weights[j], b, j) for b, mb in enumerate(ranks[q]) for j in mb),
        key=lambda t: (t[0], t[2]),
    )
    their_w = [t[0] for t in theirs]
    roomiest = min(range(len(ranks[q])), key=lambda b: (mb_s[q][b], mb_w[q][b]))
    best = None
    best_err = gap
    for a, mb in enumerate(ranks[p]):
        for i in mb:
            x, s = weights[i], sizes[i]
            err = abs(2 * x - gap)
            if (
                len(mb) > 1
                and 0 < x < gap
                and err < best_err
                and mb_s[q][roomiest] + s <= cap
                and mb_w[q][roomiest] + x <= ceiling
            ):
                best, best_err = (a, i, roomiest, None, x), err
            at = int(np.searchsorted(their_w, x - gap / 2))
            for t in range(max(0, at - 4), min(len(theirs), at + 4)):
                y, b, j = theirs[t]
                d = x - y
                err = abs(2 * d - gap)
                if not (0 < d < gap and err < best_err):
                    continue
                shift = s - sizes[j]
                fits_q = mb_s[q][b] + shift <= cap or len(ranks[q][b]) == 1
                fits_p = mb_s[p][a] - shift <= cap or len(mb) == 1
                if fits_q and fits_p and mb_w[q][b] + d <= ceiling:
                    best, best_err = (a, i, b, j, d), err
    return best


def _best(candidates: list[_Plan], st: _Step, tolerance: float) -> _Plan:
    """The candidate of least score, where micro-batch/rank imbalances within `tolerance` of
    the best count as equal, so that rank imbalance (a straggler) decides between them."""
    scores = [_plan_score(plan, st.weights) for plan in candidates]
    k = min(score[0] for score in scores)
    worst = min(score[1] for score in scores if score[0] == k) * (1 + tolerance)
    eligible = [i for i, score in enumerate(scores) if score[0] == k and score[1] <= worst]
    return candidates[min(eligible, key=lambda i: (scores[i][2], scores[i][1]))]


def _plan_score(plan: _Plan, weights: np.ndarray) -> tuple[int, float, float]:
    """`_score` of a plan, with numpy."""
    mb_cost = plan.mb_weights(weights)
    rank_cost = mb_cost.sum(1)
    mb_imb = float(mb_cost.max()) * mb_cost.size / float(mb_cost.sum())
    rank_imb = float(rank_cost.max()) * rank_cost.size / float(rank_cost.sum())
    return plan.k, max(mb_imb, rank_imb), rank_imb


def _score(ranks: Sequence[Sequence[Sequence[int]]], w: Sequence[int]) -> tuple[int, float, float]:
    """Fewer micro-batches per rank, then the worse of micro-batch and rank imbalance, then
    the rank imbalance (a straggler costs every rank); imbalance in the balanced cost."""
    mb_cost = [sum(w[i] for i in mb) for rank in ranks for mb in rank]
    rank_cost = [sum(w[i] for mb in rank for i in mb) for rank in ranks]
    mb_imb = max(mb_cost) * len(mb_cost) / sum(mb_cost)
    rank_imb = max(rank_cost) * len(rank_cost) / sum(rank_cost)
    return len(ranks[0]), max(mb_imb, rank_imb), rank_imb
