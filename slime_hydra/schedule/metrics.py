"""Per-step schedule metrics (the batch/* keys of DESIGN.md), computed from the schedule alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slime_hydra.partition import align_up
from slime_hydra.partition.bounds import max_part_lower_bound, min_bins_lower_bound
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


def _imbalance(values: np.ndarray) -> float:
    mean = float(values.mean())
    return float(values.max()) / mean if mean else 1.0


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
    count could still gain. numpy over the step's samples: a million samples in well under a
    second.
    """
    counts, samples = step.flat()
    step_lengths = np.asarray(lengths, dtype=np.int64)[samples]
    linear, quadratic = flops_coefficients
    flops = linear * step_lengths + quadratic * step_lengths.astype(np.float64) ** 2
    mb_of = np.repeat(np.arange(counts.size), counts)
    mb_tokens = np.bincount(mb_of, weights=step_lengths, minlength=counts.size).astype(np.int64)
    mb_flops = np.bincount(mb_of, weights=flops, minlength=counts.size)
    dp = len(step.mbs_per_rank)
    rank_of_mb = np.repeat(np.arange(dp), step.mbs_per_rank)
    rank_tokens = np.bincount(rank_of_mb, weights=mb_tokens, minlength=dp)
    rank_flops = np.bincount(rank_of_mb, weights=mb_flops, minlength=dp)
    k = step.num_microbatches
    if cap is None:
        lower_bound, utilization, violations, oversize = k, None, 0, 0
    else:
        lower_bound = microbatch_lower_bound(
            step_lengths, cap, layout.dp, layout.microbatch_alignment
        )
        utilization = float(mb_tokens.sum()) / (counts.size * cap)
        violations = int(breaks_cap(counts, mb_tokens, cap).sum())
        oversize = int((step_lengths > cap).sum())
    return {
        "batch/num_microbatches": k,
        "batch/num_microbatches_lb": lower_bound,
        "batch/mb_tokens_max": int(mb_tokens.max()),
        "batch/mb_tokens_mean": float(mb_tokens.mean()),
        "batch/mb_tokens_min": int(mb_tokens.min()),
        "batch/token_imbalance": _imbalance(mb_tokens),
        "batch/dp_token_imbalance": _imbalance(rank_tokens),
        "batch/flops_imbalance": _imbalance(mb_flops),
        "batch/dp_flops_imbalance": _imbalance(rank_flops),
        "batch/mb_tokens_lb": max_part_lower_bound(
            step_lengths, counts.size, upper=int(mb_tokens.max())
        ),
        "batch/cap_utilization": utilization,
        "batch/cap_violations": violations,
        "batch/empty_microbatches": int((counts == 0).sum()),
        "batch/oversize_samples": oversize,
        "batch/plan_ms": step.plan_ms,
    }
