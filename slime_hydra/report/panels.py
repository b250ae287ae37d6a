"""Which per-step metrics get a panel of their own, and how a sweep reduces each to one number
per job: a panel exists only for a metric the run logged (plan runs log sim/*, cpu and gpu
training runs train/* and perf/*)."""

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


def step_panels(rows: Sequence[Metrics]) -> list[StepPanel]:
    """The panels of STEP_PANELS whose metric at least one row logged."""
    return [panel for panel in STEP_PANELS if logged(rows, panel.key)[0]]


def sweep_value(rows: Sequence[Metrics], panel: StepPanel) -> float | None:
    """A job's one number for `panel` (None when the job did not log the metric)."""
    values = logged(rows, panel.key)[1]
    return panel.reduce(values) if values else None
