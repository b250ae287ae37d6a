"""slime's dynamic batching as it shipped in PR #1823 (286750a) and its revert #1848 (8acc034).

Faults included, so sweeps can measure them side by side with slime_hydra's own schedules:
(1) the DP split covers the WHOLE rollout: rank r takes global samples r, r+dp, ... or, with
balance_data, one equal-size Karmarkar-Karp split of all lengths (slime's rollout manager);
each rank cuts its own samples into steps of global_batch_size / dp; (2) each rank counts the
first-fit bins of its step under cap = max_tokens_per_gpu × cp; (3) K = the largest count
(slime's all-reduce MAX); (4) with vpp > 1, #1848 rounds K down to a multiple of the VPP group
(at least 1) and #1823 rounds it up; (5) each rank splits its step into K parts with slime's
get_seqlen_balanced_partitions (its tie-breaking, its assertions), and #1823 re-packs a rank
whose parts break the cap by first-fit into exactly K bins, leaving trailing bins empty (slime
issue #1838). Where slime raises, planning raises a SlimeHydraError saying so: in a sweep that
job fails alone, as slime's run would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from enum import StrEnum

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.slime_kk import (
    SlimeAssertionError,
    slime_balanced_partitions,
    slime_capped_partitions,
    slime_first_fit_count,
)
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.schedule import Schedule, StepSchedule
from slime_hydra.schedule.strategy import BatchingStrategy, RankMicrobatches, where


class VppRounding(StrEnum):
    """Which way slime rounded the micro-batch count to the VPP group."""

    down = "down"
    up = "up"


class SlimeLegacyBatching(BatchingStrategy):
    """A legacy preset: reproduces slime's schedule exactly, faults included, so sweeps can
    measure it (its schedules are measured, not trusted)."""

    def __init__(
        self,
        layout: ParallelLayout,
        global_batch_size: int | None,
        max_tokens_per_gpu: int,
        vpp_rounding: VppRounding | str,
        cap_fallback: bool,
        balance_data: bool = False,
        preset: str = "slime",
        flops_coefficients: tuple[float, float] | None = None,
    ) -> None:
        if max_tokens_per_gpu is None:
            raise SlimeHydraError(
                f"batching={preset} needs batching.max_tokens_per_gpu; set it, e.g. "
                "batching.max_tokens_per_gpu=8192."
            )
        super().__init__(layout, global_batch_size, max_tokens_per_gpu, flops_coefficients)
        self.vpp_rounding = VppRounding(vpp_rounding)
        self.cap_fallback = cap_fallback
        self.balance_data = balance_data
        self.preset = preset

    @property
    def name(self) -> str:
        return self.preset

    def plan(
        self,
        lengths: Sequence[int],
        group_ids: Sequence[int],
        step_ids: Sequence[int] | None = None,
    ) -> Schedule:
        """slime's schedule of the whole rollout (group ids and trace steps play no part in
        slime's split; the invariant checker reports groups it splits over steps)."""
        del group_ids, step_ids
        lengths = [int(n) for n in lengths]
        gbs = len(lengths) if self.global_batch_size is None else self.global_batch_size
        steps = [
            StepSchedule.build(s, ranks, ms)
            for s, (ranks, ms) in enumerate(
                self._plan_rollout(lengths, list(range(len(lengths))), gbs)
            )
        ]
        return Schedule(lengths=tuple(lengths), cap=self.cap, steps=tuple(steps))

    def plan_step(self, lengths: Sequence[int], samples: list[int], step: int) -> StepSchedule:
        """`samples` planned as a rollout of one step."""
        return StepSchedule.build(
            step, self._plan_rollout(lengths, samples, len(samples), step)[0][0]
        )

    def _crash(self, step: int | None, what: str) -> SlimeHydraError:
        return SlimeHydraError(
            f"{where(step)}slime would crash here: batching={self.preset} reproduces slime's "
            f"code, which raises {what}. This is the legacy preset's measured behaviour, not a "
            "bug to fix; use batching=dynamic for a schedule that plans this rollout."
        )

    def _plan_rollout(
        self, lengths: Sequence[int], samples: list[int], gbs: int, first_step: int = 0
    ) -> list[tuple[RankMicrobatches, float]]:
        """Per step: each rank's micro-batches (global sample indices) and the plan time."""
        cap = self.cap
        assert cap is not None
        dp = self.layout.dp
        start = time.perf_counter()
        if self.balance_data:
            try:
                split = slime_balanced_partitions([lengths[i] for i in samples], dp, True)
            except SlimeAssertionError as exc:
                raise self._crash(
                    None, f"AssertionError: {exc} (balance_data's DP split)"
                ) from None
            rank_ids = [[samples[j] for j in part] for part in split]
        else:
            rank_ids = [samples[r::dp] for r in range(dp)]
        local = gbs // dp
        if local == 0:
            raise self._crash(
                None, f"ZeroDivisionError (global_batch_size={gbs} // dp={dp} samples per rank)"
            )
        num_steps = {len(ids) // local for ids in rank_ids}
        if any(len(ids) % local for ids in rank_ids) or len(num_steps) > 1:
            raise self._crash(
                None,
                f"AssertionError (its ranks hold {sorted({len(ids) for ids in rank_ids})} "
                f"samples, not whole steps of global_batch_size // dp = {local})",
            )
        g = self.layout.microbatch_alignment
        out: list[tuple[RankMicrobatches, float]] = []
        for s in range(num_steps.pop()):
            step = first_step + s
            chunks = [ids[s * local : (s + 1) * local] for ids in rank_ids]
            weights = [[lengths[i] for i in ids] for ids in chunks]
            k = max(slime_first_fit_count(w, cap) for w in weights)
            if self.layout.vpp > 1:
                k = max(1, k // g * g) if self.vpp_rounding is VppRounding.down else -(-k // g) * g
            ranks: RankMicrobatches = []
            for r, (ids, w) in enumerate(zip(chunks, weights, strict=True)):
                try:
                    parts = slime_balanced_partitions(w, k, False)
                    if self.cap_fallback and any(sum(w[j] for j in p) > cap for p in parts):
                        parts = slime_capped_partitions(w, k, cap)
                except SlimeAssertionError as exc:
                    raise self._crash(step, f"AssertionError: {exc} on DP rank {r}") from None
                ranks.append([[ids[j] for j in part] for part in parts])
            now = time.perf_counter()
            out.append((ranks, (now - start) * 1e3))
            start = now
        return out
