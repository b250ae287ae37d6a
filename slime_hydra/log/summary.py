"""The numbers that summarise a run, from its per-step metrics rows: the wandb sink writes them
to the run's summary and the report prints them (no plotting here, so no matplotlib)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from slime_hydra.log.sink import Metrics


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


SUMMARY: tuple[tuple[str, str, Callable[[Sequence[float]], float]], ...] = (
    ("batch/cap_violations", "cap_violations_max", max),
    ("batch/cap_violations", "cap_violations_total", sum),
    ("batch/empty_microbatches", "empty_microbatches_total", sum),
    ("batch/oversize_samples", "oversize_samples_total", sum),
    ("batch/mb_tokens_max", "mb_tokens_max", max),
    ("batch/token_imbalance", "token_imbalance_mean", _mean),
    ("batch/dp_token_imbalance", "dp_token_imbalance_mean", _mean),
    ("batch/num_microbatches", "num_microbatches_mean", _mean),
    ("batch/num_microbatches_lb", "num_microbatches_lb_mean", _mean),
)
"""(metric key, summary name, reduction over steps) of every summary number."""


def run_summary(rows: Sequence[Metrics]) -> dict[str, float]:
    """Whole-run numbers from per-step metrics: worst cap violation, mean imbalance, totals."""
    summary: dict[str, float] = {"steps": len(rows)}
    for key, name, reduce in SUMMARY:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            summary[name] = reduce(values)
    return summary
