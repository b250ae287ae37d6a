"""Per-step schedule metrics (the batch/* keys of DESIGN.md), computed from the schedule alone."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import numpy as np

from slime_hydra.partition import align_up
from slime_hydra.partition.bounds import max_part_lower_bound, min_bins_lower_bound
from slime_hydra.partition.workload import flops_workloads
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.schedule import StepSchedule, breaks_cap


def microbatch_lower_bound(
    lengths: Sequence[int] | np.ndarray, cap: int, dp: int, align: int
) -> int:
    """Fewest micro-batches per rank any cap-respecting schedule needs: one per sample over the
    cap (isolated), Martello and Toth's L2 bin bound on the rest (at least ⌈ΣL / cap⌉ and one
    per sample over cap/2), over dp, rounded up to the VPP alignment. The planner's K_lb."""
    sizes = np.asarray(lengths, dtype=np.int64)
    over = sizes > cap
    bins = int(over.sum()) + min_bins_lower_bound(sizes[~over], cap)
    return align_up(max(-(-bins // dp), 1), align)


def _imbalance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean else 1.0


def step_metrics(
    step: StepSchedule,
    lengths: Sequence[int],
    cap: int | None,
    layout: ParallelLayout,
    flops_coefficients: tuple[float, float],
) -> dict[str, float | int | None]:
    """The batch/* metrics of one step (per rank counts, imbalances as max/mean).

    `flops_imbalance` is over micro-batches and `dp_flops_imbalance` over DP ranks, with a
    sequence's cost a·L + b·L² from `flops_coefficients`. `mb_tokens_lb` is a proven lower
    bound on the largest micro-batch of any schedule with this step's micro-batch count
    (partition.bounds), so `mb_tokens_max / mb_tokens_lb - 1` is the most any schedule at this
    count could still gain.
    """
    mbs = [mb for rank in step.ranks for mb in rank]
    per_rank = step.microbatch_tokens(lengths)
    mb_tokens = [t for rank in per_rank for t in rank]
    rank_tokens = [sum(rank) for rank in per_rank]
    linear, quadratic = flops_coefficients
    mb_flops = [sum(flops_workloads([lengths[i] for i in mb], linear, quadratic)) for mb in mbs]
    ends = list(accumulate(len(rank) for rank in step.ranks))
    rank_flops = [
        sum(mb_flops[e - len(rank) : e]) for rank, e in zip(step.ranks, ends, strict=True)
    ]
    samples = step.samples
    k = step.num_microbatches
    if cap is None:
        lower_bound, utilization, violations, oversize = k, None, 0, 0
    else:
        step_lengths = [lengths[i] for i in samples]
        lower_bound = microbatch_lower_bound(
            step_lengths, cap, layout.dp, layout.microbatch_alignment
        )
        utilization = sum(mb_tokens) / (len(mbs) * cap)
        violations = sum(
            1 for mb, t in zip(mbs, mb_tokens, strict=True) if breaks_cap(len(mb), t, cap)
        )
        oversize = sum(1 for n in step_lengths if n > cap)
    return {
        "batch/num_microbatches": k,
        "batch/num_microbatches_lb": lower_bound,
        "batch/mb_tokens_max": max(mb_tokens),
        "batch/mb_tokens_mean": sum(mb_tokens) / len(mb_tokens),
        "batch/mb_tokens_min": min(mb_tokens),
        "batch/token_imbalance": _imbalance(mb_tokens),
        "batch/dp_token_imbalance": _imbalance(rank_tokens),
        "batch/flops_imbalance": _imbalance(mb_flops),
        "batch/dp_flops_imbalance": _imbalance(rank_flops),
        "batch/mb_tokens_lb": max_part_lower_bound(
            [lengths[i] for i in step.samples], len(mbs), upper=max(mb_tokens)
        ),
        "batch/cap_utilization": utilization,
        "batch/cap_violations": violations,
        "batch/empty_microbatches": sum(1 for mb in mbs if not mb),
        "batch/oversize_samples": oversize,
        "batch/plan_ms": step.plan_ms,
    }
