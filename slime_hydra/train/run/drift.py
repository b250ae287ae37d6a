"""The calibration's drift, said once in the log: where the median of the last WINDOW steps'
measured over predicted step time (perf/sim_ratio) leaves 1/DRIFT..DRIFT, the calibration file
no longer describes the machine (its load, clocks or neighbours changed: on this project's
2-core machine one layout's per-micro-batch term halved in 76 minutes), so plan mode's figures
and batching.count=fastest's choices rest on stale costs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

WINDOW = 5
"""Steps whose median ratio is judged (one slow or fast step is noise, five in a row are not)."""
DRIFT = 1.15
"""How far the median may stray: the ±15% a calibration is held to (README)."""


@dataclass
class DriftCheck:
    """Watches one process's steps against the calibration file `cost_file`; the first step it
    sees is warm-up (allocator, threads, caches) and not judged."""

    cost_file: str
    judged: list[tuple[int, float]] = field(default_factory=list)
    """(step, ratio) of each step judged, in order."""
    warmed_up: bool = False
    warned: bool = False

    def observe(self, step: int, ratio: float) -> str | None:
        """The warning to log after step `step` (counted from 1) measured `ratio` times its
        prediction, or None: at most one a run."""
        if not self.warmed_up:
            self.warmed_up = True
            return None
        if self.warned or not math.isfinite(ratio):
            return None
        self.judged.append((step, ratio))
        if len(self.judged) < WINDOW:
            return None
        window = self.judged[-WINDOW:]
        median = statistics.median(r for _, r in window)
        if 1 / DRIFT <= median <= DRIFT:
            return None
        self.warned = True
        return (
            f"steps {window[0][0]}-{step} took {median:.2f}x the step time that "
            f"trainer.cost={self.cost_file} predicts (median of perf/sim_ratio), beyond the "
            f"{DRIFT:.2f}x a calibration is held to: the machine or its load changed since it "
            "was calibrated, so sim/step_s and batching.count=fastest rest on stale costs. "
            "Calibrate again (python -m slime_hydra.calibrate --out FILE with this run's "
            "overrides) and pass trainer.cost=FILE."
        )
