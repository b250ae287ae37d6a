"""Fixed batching: micro_batch_size samples per micro-batch, balanced by Karmarkar-Karp."""

from __future__ import annotations

from collections.abc import Sequence

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition import karmarkar_karp
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.schedule import StepSchedule
from slime_hydra.schedule.strategy import BatchingStrategy, where


class FixedBatching(BatchingStrategy):
    """Every micro-batch holds exactly `micro_batch_size` samples, whatever their lengths.

    Samples are split across DP ranks and then into micro-batches by equal-count Karmarkar-Karp
    on lengths. The token cap, if set, is not enforced: the metrics measure against it.
    """

    def __init__(
        self,
        layout: ParallelLayout,
        global_batch_size: int,
        micro_batch_size: int,
        max_tokens_per_gpu: int | None = None,
    ) -> None:
        super().__init__(layout, global_batch_size, max_tokens_per_gpu)
        if micro_batch_size < 1:
            raise SlimeHydraError(
                f"batching.micro_batch_size={micro_batch_size} must be a positive integer."
            )
        self.micro_batch_size = micro_batch_size

    def check_step_size(self, num_samples: int, step: int | None = None) -> None:
        """A step must split evenly into dp ranks × K micro-batches of micro_batch_size."""
        super().check_step_size(num_samples, step)
        dp, mbs = self.layout.dp, self.micro_batch_size
        if num_samples % dp:
            raise SlimeHydraError(
                f"{where(step)}{num_samples} samples do not split evenly over parallel.dp={dp} "
                "ranks for fixed batching; set batching.global_batch_size to a multiple of "
                f"{dp}, or use batching=dynamic."
            )
        local = num_samples // dp
        if local % mbs:
            raise SlimeHydraError(
                f"{where(step)}each DP rank gets {local} samples, not a multiple of "
                f"batching.micro_batch_size={mbs}; set batching.micro_batch_size to a divisor "
                f"of {local}."
            )
        g = self.layout.microbatch_alignment
        if (local // mbs) % g:
            raise SlimeHydraError(
                f"{where(step)}fixed batching gives {local // mbs} micro-batches per rank, not a "
                f"multiple of parallel.microbatch_group_size_per_vp_stage={g} that vpp="
                f"{self.layout.vpp} needs; change batching.micro_batch_size or "
                "batching.global_batch_size, or use batching=dynamic."
            )

    def plan_step(self, lengths: Sequence[int], samples: list[int], step: int) -> StepSchedule:
        k = len(samples) // self.layout.dp // self.micro_batch_size
        ranks = []
        for part in karmarkar_karp([lengths[i] for i in samples], self.layout.dp, equal_size=True):
            ids = [samples[j] for j in part]
            micro = karmarkar_karp([lengths[i] for i in ids], k, equal_size=True)
            ranks.append([[ids[j] for j in mb] for mb in micro])
        return StepSchedule.build(step, ranks)
