"""Which per-step metrics the report plots, and how a sweep reduces each to one number per job: a
panel exists only for metrics the run logged (plan runs log sim/*, cpu and gpu training runs
train/* and perf/*, every run the batch/* schedule metrics; a hand-written file may hold fewer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import fmean

from slime_hydra.log.sink import Metrics


@dataclass(frozen=True)
class StepPanel:
    """One metric over the steps of a run, and its one number per job in a sweep."""

    key: str
    title: str
    ylabel: str
    sweep_title: str
    reduce: Callable[[Sequence[float]], float]
    fmt: str
    from_zero: bool = True
    """The y axis starts at 0 (a time or a share), not at the smallest value (a loss)."""


COUNT_KEYS = ("batch/num_microbatches", "batch/num_microbatches_lb", "batch/empty_microbatches")
"""What the micro-batch count panel reads (the count itself, its lower bound, empty ones)."""

IMBALANCE_KEYS = (
    ("batch/token_imbalance", "micro-batch tokens"),
    ("batch/dp_token_imbalance", "DP rank tokens"),
    ("batch/flops_imbalance", "micro-batch FLOPs"),
    ("batch/dp_flops_imbalance", "DP rank FLOPs"),
)
"""(metric, label) of each line of the imbalance panel."""


def _last(values: Sequence[float]) -> float:
    return values[-1]


STEP_PANELS = (
    StepPanel(
        "train/loss",
        "Training loss",
        "loss",
        "training loss (last step)",
        _last,
        "{:.4f}",
        from_zero=False,
    ),
    StepPanel(
        "perf/tokens_per_s",
        "Throughput",
        "tokens / s",
        "tokens / s (mean over steps)",
        fmean,
        "{:,.0f}",
    ),
    StepPanel(
        "sim/step_s",
        "Simulated step time (slowest DP rank)",
        "seconds",
        "simulated step time (mean s)",
        fmean,
        "{:.3g}",
    ),
    StepPanel(
        "sim/bubble_frac",
        "Simulated pipeline bubble (idle share of all stages)",
        "bubble fraction",
        "pipeline bubble (mean idle share)",
        fmean,
        "{:.3f}",
    ),
)
"""The metrics plotted step by step (after the tokens, counts and imbalance panels)."""


def logged(rows: Sequence[Metrics], key: str) -> tuple[list[int], list[float]]:
    """The steps that logged `key` (a value, not null) and those values."""
    pairs = [(row["step"], row[key]) for row in rows if row.get(key) is not None]
    return [s for s, _ in pairs], [v for _, v in pairs]


def plotted_keys() -> set[str]:
    """Every metric a report reads: its values must be numbers (or null)."""
    return {*COUNT_KEYS, *(k for k, _ in IMBALANCE_KEYS), *(p.key for p in STEP_PANELS)}


def step_panels(rows: Sequence[Metrics]) -> list[StepPanel]:
    """The panels of STEP_PANELS whose metric at least one row logged."""
    return [panel for panel in STEP_PANELS if logged(rows, panel.key)[0]]


def sweep_value(rows: Sequence[Metrics], panel: StepPanel) -> float | None:
    """A job's one number for `panel` (None when the job did not log the metric)."""
    values = logged(rows, panel.key)[1]
    return panel.reduce(values) if values else None
