"""The planning API: lengths, a layout and a cap in; per-step, per-rank micro-batches and their
metrics out. No torch, Hydra or I/O. It runs the CLI's own objects (a BatchingStrategy's plan,
the invariant checker, step_metrics), so a script and `python -m slime_hydra` plan alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from slime_hydra.schedule import (
    BatchingStrategy,
    DynamicBatching,
    ParallelLayout,
    Schedule,
    step_metrics,
    violations,
)
from slime_hydra.schedule.dynamic import Oversize

TOKENS_ONLY = (1.0, 0.0)
"""FLOPs coefficients (a, b) of a·L + b·L² when no model is named: the FLOPs metrics then count
tokens, as the token metrics do."""

Metrics = dict[str, float | int | None]


@dataclass(frozen=True)
class PlannedRollout:
    """A rollout's Schedule, the layout it was planned for, each step's batch/* metrics (the
    keys the CLI logs) and every invariant it breaks (empty for dynamic batching)."""

    schedule: Schedule
    layout: ParallelLayout
    metrics: tuple[Metrics, ...]
    violations: tuple[str, ...]

    def microbatches(self, step: int) -> list[list[list[int]]]:
        """Step `step`'s (0-based) micro-batches: `[rank][microbatch]` → global sample indices."""
        return [[list(mb) for mb in rank] for rank in self.schedule.steps[step].ranks]

    @property
    def num_microbatches(self) -> list[int]:
        """Micro-batches per DP rank of each step (one count on every rank)."""
        return [step.num_microbatches for step in self.schedule.steps]


def plan_rollout(
    lengths: Sequence[int],
    layout: ParallelLayout,
    max_tokens_per_gpu: int,
    group_ids: Sequence[int] | None = None,
    step_ids: Sequence[int] | None = None,
    *,
    global_batch_size: int | None = None,
    oversize: Oversize | str = Oversize.error,
    flops_coefficients: tuple[float, float] | None = None,
) -> PlannedRollout:
    """Plan a rollout with dynamic batching (`batching=dynamic`): the fewest micro-batches
    under the cap max_tokens_per_gpu × layout.cp, one count on every DP rank, a multiple of the
    VPP group, balanced across ranks.

    `group_ids` (null: every sample its own group) keep a rollout group in one step;
    `step_ids` give the steps (as a trace does), else whole groups fill steps of
    `global_batch_size` samples (null: the whole rollout is one step). `oversize`: a sample over
    the cap is an error, or with "isolate" a micro-batch of its own. `flops_coefficients` (a, b)
    of a sequence's cost a·L + b·L² (schedule.cost.flops_coefficients of a model) are what
    the FLOPs metrics use; null counts tokens.
    """
    strategy = DynamicBatching(layout, global_batch_size, max_tokens_per_gpu, oversize=oversize)
    return run_strategy(strategy, lengths, group_ids, step_ids, flops_coefficients)


def run_strategy(
    strategy: BatchingStrategy,
    lengths: Sequence[int],
    group_ids: Sequence[int] | None = None,
    step_ids: Sequence[int] | None = None,
    flops_coefficients: tuple[float, float] | None = None,
) -> PlannedRollout:
    """Plan with any strategy (DynamicBatching, FixedBatching, a legacy preset) as the CLI does,
    then check and measure its schedule; arguments as in `plan_rollout`."""
    groups = list(range(len(lengths))) if group_ids is None else list(group_ids)
    schedule = strategy.plan(lengths, groups, step_ids)
    coefficients = flops_coefficients or strategy.flops_coefficients or TOKENS_ONLY
    metrics = tuple(
        step_metrics(step, schedule.lengths, schedule.cap, strategy.layout, coefficients)
        for step in schedule.steps
    )
    broken = violations(
        schedule, strategy.layout, groups, allow_oversize=strategy.isolates_oversize
    )
    return PlannedRollout(schedule, strategy.layout, metrics, tuple(broken))
