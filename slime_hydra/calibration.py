"""The calibration file: a step cost model (schedule/steptime.py) measured on one machine for
one model and layout. `python -m slime_hydra.calibrate` writes it; trainer.cost=FILE loads it
for plan mode, the trainers' sim/step_s and batching.count=fastest.

    {"format": 1, "model": "qwen2_5_0_5b", "device": "...",
     "layout": {"dp": 2, "tp": 1, "pp": 2, "vpp": 2, "cp": 1},
     "terms": {"token_s": ..., "square_s": ..., "microbatch_s": ..., "p2p_s": ...,
               "allreduce_s": ..., "optimizer_s": ...},
     "stderr": {...the same keys...}, "samples": [...what was timed...]}

The terms are per model replica of the layout, so a file holds for one model and one
(tp, pp, vpp, cp); dp changes only the all-reduce, which the file measured at its own dp.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import parse_json, read_text
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.steptime import StepCost

FORMAT = 1
SHAPE = ("tp", "pp", "vpp", "cp")
"""The layout sizes a calibration holds for."""


def load_step_cost(path: str | Path, model: str, layout: ParallelLayout) -> StepCost:
    """The step cost of a calibration file, refused where it was measured for another model
    or (tp, pp, vpp, cp) than the run's."""
    fix = (
        "point trainer.cost at a file python -m slime_hydra.calibrate wrote, or set "
        "trainer.cost=null."
    )
    data = parse_json(read_text(Path(path), "trainer.cost", fix), str(path))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SlimeHydraError(
            f"trainer.cost={path} is not a calibration file of format {FORMAT}; {fix}"
        )
    theirs = data.get("layout") if isinstance(data.get("layout"), dict) else {}
    mine = {key: getattr(layout, key) for key in SHAPE}
    if {key: theirs.get(key) for key in SHAPE} != mine or data.get("model") != model:
        raise SlimeHydraError(
            f"trainer.cost={path} was calibrated for model {data.get('model')!r} with "
            f"{ {key: theirs.get(key) for key in SHAPE} }, this run is model {model!r} with "
            f"{mine}; calibrate this one (python -m slime_hydra.calibrate model=... "
            "parallel....) or set trainer.cost=null for the analytic model."
        )
    terms = data.get("terms")
    if not isinstance(terms, Mapping):
        raise SlimeHydraError(f"trainer.cost={path} has no 'terms' mapping; {fix}")
    return StepCost.from_mapping(terms, source=str(path))


def calibration_json(
    cost: StepCost,
    stderr: Mapping[str, float],
    model: str,
    device: str,
    layout: ParallelLayout,
    samples: list[dict[str, Any]],
) -> str:
    """The text of a calibration file for `cost` (see the module docstring)."""
    terms = {k: getattr(cost, k) for k in StepCost.__dataclass_fields__ if k != "source"}
    data = {
        "format": FORMAT,
        "model": model,
        "device": device,
        "layout": {key: getattr(layout, key) for key in ("dp", *SHAPE)},
        "terms": terms,
        "stderr": dict(stderr),
        "samples": samples,
    }
    return json.dumps(data, indent=1) + "\n"
