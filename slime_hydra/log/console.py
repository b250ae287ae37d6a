"""A compact per-step table on stdout: the numbers an engineer scans first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_hydra.files import stdout_full
from slime_hydra.log.sink import Metrics, RunInfo

if TYPE_CHECKING:
    from slime_hydra.schedule import Schedule

COLUMNS = (
    ("step", "step", "{:>4}"),
    ("batch/num_microbatches", "mbs", "{:>4}"),
    ("batch/num_microbatches_lb", "lb", "{:>4}"),
    ("batch/mb_tokens_max", "mb_max", "{:>7}"),
    ("batch/mb_tokens_min", "mb_min", "{:>7}"),
    ("batch/token_imbalance", "mb_imb", "{:>6.3f}"),
    ("batch/dp_token_imbalance", "dp_imb", "{:>6.3f}"),
    ("batch/cap_utilization", "cap_use", "{:>7.3f}"),
    ("batch/cap_violations", "over", "{:>4}"),
    ("batch/empty_microbatches", "empty", "{:>5}"),
    ("batch/plan_ms", "plan_ms", "{:>7.2f}"),
    ("sim/step_s", "sim_s", "{:>7.3f}"),
    ("sim/bubble_frac", "bubble", "{:>6.3f}"),
    ("train/loss", "loss", "{:>8.4f}"),
    ("perf/step_s", "step_s", "{:>6.2f}"),
)


class ConsoleSink:
    """Prints a header once, then one row per step, with the columns present in the metrics."""

    def __init__(self, run: RunInfo, schedule: Schedule | None = None) -> None:
        del run, schedule
        self._columns: list[tuple[str, str, int]] = []

    def log(self, metrics: Metrics) -> None:
        """Print this step's row (and the header before the first); stdout on a full disk
        stops the table with one line (files.stdout_full), never the run."""
        try:
            self._print(metrics)
        except OSError as exc:
            if not stdout_full(exc):
                raise

    def _print(self, metrics: Metrics) -> None:
        if not self._columns:
            self._columns = [
                (key, fmt, max(len(header), len(fmt.format(0))))
                for key, header, fmt in COLUMNS
                if key in metrics
            ]
            headers = {key: header for key, header, _ in COLUMNS}
            print(" ".join(f"{headers[key]:>{w}}" for key, _, w in self._columns))
        cells = []
        for key, fmt, width in self._columns:
            value = metrics.get(key)
            cells.append(f"{'-' if value is None else fmt.format(value):>{width}}")
        print(" ".join(cells), flush=True)

    def close(self) -> None:
        """Nothing to close."""
