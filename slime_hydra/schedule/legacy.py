"""slime's dynamic batching as it shipped in PR #1848 and PR #1823, faults included.

Per step: (1) sample i goes to DP rank i mod dp, or with balance_data an equal-count
Karmarkar-Karp split; (2) each rank counts its first-fit bins under the cap; (3) K = the
largest count (slime's all-reduce MAX); (4) with vpp > 1, #1848 rounds K down to a multiple of
the VPP group (clamped to at least 1) and #1823 rounds it up; (5) each rank splits its samples
into K parts by free-size Karmarkar-Karp, and #1823 re-packs a rank whose parts break the cap
by first-fit into exactly K bins, leaving trailing bins empty (slime issue #1838).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition import first_fit, karmarkar_karp
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.strategy import BatchingStrategy, RankMicrobatches


class VppRounding(StrEnum):
    """Which way slime rounded the micro-batch count to the VPP group."""

    down = "down"
    up = "up"


class SlimeLegacyBatching(BatchingStrategy):
    """A legacy preset: reproduces slime's schedule exactly, so sweeps can measure it."""

    legacy = True

    def __init__(
        self,
        layout: ParallelLayout,
        global_batch_size: int | None,
        max_tokens_per_gpu: int,
        vpp_rounding: VppRounding | str,
        cap_fallback: bool,
        balance_data: bool = False,
        preset: str = "slime",
    ) -> None:
        if max_tokens_per_gpu is None:
            raise SlimeHydraError(
                f"batching={preset} needs batching.max_tokens_per_gpu; set it, e.g. "
                "batching.max_tokens_per_gpu=8192."
            )
        super().__init__(layout, global_batch_size, max_tokens_per_gpu)
        self.vpp_rounding = VppRounding(vpp_rounding)
        self.cap_fallback = cap_fallback
        self.balance_data = balance_data
        self.preset = preset

    @property
    def name(self) -> str:
        return self.preset

    def plan_step(self, lengths: Sequence[int], samples: list[int], step: int) -> RankMicrobatches:
        cap = self.cap
        assert cap is not None
        dp = self.layout.dp
        if self.balance_data:
            split = karmarkar_karp([lengths[i] for i in samples], dp, equal_size=True)
            rank_ids = [[samples[j] for j in part] for part in split]
        else:
            rank_ids = [samples[r::dp] for r in range(dp)]
        rank_lengths = [[lengths[i] for i in ids] for ids in rank_ids]
        k = max(len(first_fit(w, cap) or []) for w in rank_lengths)
        g = self.layout.microbatch_alignment
        k = max(1, k // g * g) if self.vpp_rounding is VppRounding.down else -(-k // g) * g
        ranks = []
        for ids, w in zip(rank_ids, rank_lengths, strict=True):
            parts = karmarkar_karp(w, k)
            if self.cap_fallback and any(sum(w[j] for j in p) > cap for p in parts):
                # K >= this rank's first-fit count when K was rounded up, so the packing fits.
                parts = first_fit(w, cap, max_bins=k) or parts
                parts += [[] for _ in range(k - len(parts))]
            ranks.append([[ids[j] for j in part] for part in parts])
        return ranks
