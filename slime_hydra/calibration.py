"""The calibration file: a step cost model (schedule/steptime.py) measured on one machine for
one model and layout. `python -m slime_hydra.calibrate` writes it; trainer.cost=FILE loads it
for plan mode, the trainers' sim/step_s and batching.count=fastest.

    {"format": 1, "model": "qwen2_5_0_5b", "device": "...",
     "layout": {"dp": 2, "tp": 1, "pp": 2, "vpp": 2, "cp": 1},
     "terms": {"token_s": ..., "square_s": ..., "microbatch_s": ..., "sequence_s": ...,
               "microbatch_square_s": ..., "p2p_s": ..., "allreduce_s": ..., "optimizer_s": ...},
     "stderr": {...the same keys...}, "samples": [...the timed steps...],
     "exchange_s": [...the timed p2p exchanges, pp > 1...]}

The terms are per model replica of the layout, so a file holds for one model and one
(tp, pp, vpp, cp); dp changes only the all-reduce, which the file measured at its own dp.

Units: token_s seconds per token, square_s seconds per squared sequence length (Σ L² over the
micro-batch's sequences), microbatch_s seconds per micro-batch, sequence_s seconds per sequence
of a micro-batch, microbatch_square_s seconds per squared micro-batch size ((ΣL)²: a file from
before either term loads it as 0), p2p_s seconds per exchange
between pipeline stages (one blocking call of megatron's schedule, however many transfers it
carries), allreduce_s and optimizer_s seconds per step; `stderr` holds each one's standard
error in the same unit. `calibration_grid` is what is timed, `fit_step_cost` how the terms come
out of the timings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import parse_json, read_text
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.steptime import TERMS, StepCost, simulate_step

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
    exchange_s: Sequence[float] = (),
) -> str:
    """The text of a calibration file for `cost` (see the module docstring)."""
    terms = {k: getattr(cost, k) for k in TERMS}
    data = {
        "format": FORMAT,
        "model": model,
        "device": device,
        "layout": {key: getattr(layout, key) for key in ("dp", *SHAPE)},
        "terms": terms,
        "stderr": dict(stderr),
        "samples": samples,
        "exchange_s": list(exchange_s),
    }
    return json.dumps(data, indent=1) + "\n"


PIPELINE_TERMS = ("token_s", "square_s", "microbatch_s", "sequence_s", "microbatch_square_s")
"""The terms fitted to the time in megatron's schedule; p2p_s is measured on its own."""


def calibration_grid(
    layout: ParallelLayout,
    max_tokens: int,
    max_microbatches: int | None = None,
    longest: int | None = None,
    min_tokens: int | None = None,
) -> list[tuple[int, list[int]]]:
    """What calibration times: (micro-batches per DP rank, the sequence lengths of each of
    them). Micro-batch sizes of max_tokens, max_tokens/2, ... down to `min_tokens` (default
    max_tokens/8: down to the smallest micro-batches the runs take, as the fit extrapolates
    badly below it), each as one sequence, four equal ones and sixteen short ones of the same
    total (so the L² and per-sequence terms separate from the token term; no sequence longer
    than `longest`, the model's positions: more of them where one would be), at 1, 2, 4, ...
    times the smallest count megatron's schedule takes (the VPP group) up to
    `max_microbatches` (default 4 groups), so the per-micro-batch term separates from all of
    them."""
    if max_tokens < 256:
        raise SlimeHydraError(
            f"calibration needs micro-batches of at least 256 tokens to tell its terms apart; "
            f"--max-tokens={max_tokens} is below that: raise it (at most the token cap, "
            "batching.max_tokens_per_gpu)."
        )
    min_tokens = max_tokens // 8 if min_tokens is None else min_tokens
    if not 16 <= min_tokens <= max_tokens:
        raise SlimeHydraError(
            f"--min-tokens={min_tokens}: the smallest micro-batch timed holds sixteen sequences "
            f"of at least a token and is at most the largest (--max-tokens={max_tokens}); pass "
            "the smallest micro-batch the runs take (fixed micro_batch_size=1: about one sample)."
        )
    base = layout.vp_group_size if layout.vpp > 1 else 1
    top = 4 * base if max_microbatches is None else max_microbatches
    if top < 2 * base:
        raise SlimeHydraError(
            f"--max-microbatches={top}: the fit needs at least two counts of whole VPP groups "
            f"({base} micro-batches each) to tell the per-micro-batch term apart; pass "
            f"--max-microbatches {4 * base} or more."
        )
    counts = [base << i for i in range(top.bit_length()) if base << i <= top]
    sizes = range(max_tokens.bit_length())
    totals = [max_tokens >> i for i in sizes if max_tokens >> i >= min_tokens]
    grid: list[tuple[int, list[int]]] = []
    for total in reversed(totals):
        for split in (1, 4, 16):
            parts = max(split, -(-total // longest)) if longest else split
            for entry in ((count, [total // parts] * parts) for count in counts):
                if entry not in grid:  # a split the positions forced may repeat another
                    grid.append(entry)
    return grid


def sample_ranks(sample: Mapping[str, Any], dp: int) -> list[list[list[int]]]:
    """The lengths of every micro-batch of every DP rank of a timed step (all ranks alike)."""
    return [[list(sample["microbatch"])] * int(sample["num_microbatches"])] * dp


def fit_step_cost(
    samples: Sequence[Mapping[str, Any]],
    layout: ParallelLayout,
    start: StepCost,
    source: str,
    exchange_s: Sequence[float] = (),
) -> tuple[StepCost, dict[str, float]]:
    """The step cost that explains the timed steps, with each term's standard error.

    Each sample is a timed step: `num_microbatches` micro-batches of the sequence `microbatch`
    lengths on every DP rank, `pipeline_s` seconds in megatron's schedule outside the gradient
    all-reduce, `allreduce_s` of that all-reduce and `optimizer_s` of the rest of the step.
    With pp > 1, p2p_s is the median of `exchange_s`, exchanges timed on their own: over a grid
    of equal micro-batches the exchanges grow with the count as microbatch_s does, so a fit
    cannot split the two. The other pipeline terms minimise the relative squared error of the
    simulated pipeline (schedule/steptime.py, the same simulation the runs' sim/step_s comes
    from) against `pipeline_s`: Gauss-Newton from `start`, the simulation linear in the terms
    along a critical path; a term the fit drives below zero is held at zero. The all-reduce and
    the optimizer step are the medians of their timings (their stderr, and p2p_s's: the
    mean's)."""
    terms = list(PIPELINE_TERMS)
    if len(samples) <= len(terms):
        raise SlimeHydraError(
            f"fitting {len(terms)} step cost terms takes more than {len(terms)} timed steps, "
            f"got {len(samples)}; time a larger grid (python -m slime_hydra.calibrate)."
        )
    if (layout.pp > 1) != (len(exchange_s) > 1):
        raise SlimeHydraError(
            f"pp={layout.pp} takes {'at least 2' if layout.pp > 1 else 'no'} timed rounds of "
            f"p2p exchanges, got {len(exchange_s)}; recalibrate (python -m slime_hydra.calibrate)."
        )
    ranks = [sample_ranks(s, layout.dp) for s in samples]
    measured = np.array([float(s["pipeline_s"]) for s in samples])
    tail = {name: [float(s[name]) for s in samples] for name in ("allreduce_s", "optimizer_s")}
    cost = replace(start, allreduce_s=0.0, optimizer_s=0.0, p2p_s=0.0, source=source)
    if layout.pp > 1:
        tail["p2p_s"] = list(exchange_s)
        cost = replace(cost, p2p_s=float(np.median(exchange_s)))
    for _ in range(50):
        before = np.array([getattr(cost, t) for t in terms])
        base, jacobian = pipeline_jacobian(ranks, layout, cost, terms)
        weighted = jacobian / measured[:, None]
        # What the fitted terms must explain: the time less the exchanges on the critical path.
        target = (measured - (base - jacobian @ before)) / measured
        fitted = nonnegative_fit(weighted, target)
        cost = replace(cost, **dict(zip(terms, fitted.tolist(), strict=True)))
        if np.allclose(fitted, before, rtol=1e-9, atol=0.0):
            break
    residual = target - weighted @ fitted
    variance = float(residual @ residual) / (len(samples) - len(terms))
    covariance = np.linalg.pinv(weighted.T @ weighted) * variance
    stderr = dict(zip(terms, np.sqrt(np.diag(covariance)).tolist(), strict=True))
    medians = {}
    for name, values in tail.items():
        timed = np.array(values)
        medians[name] = float(np.median(timed))
        stderr[name] = float(timed.std(ddof=1) / np.sqrt(timed.size))
    return replace(cost, **medians), stderr


def pipeline_jacobian(
    ranks: Sequence[list[list[list[int]]]], layout: ParallelLayout, cost: StepCost, terms: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's simulated pipeline seconds at `cost` and their derivatives by the `terms`,
    by a forward difference: exact along the critical path at `cost` (the simulation is
    piecewise linear in the terms)."""
    base = np.array([simulate_step(r, layout, cost).step_s for r in ranks])
    columns = []
    for name in terms:
        step = max(1e-4 * getattr(cost, name), 1e-12)
        moved = replace(cost, **{name: getattr(cost, name) + step})
        after = np.array([simulate_step(r, layout, moved).step_s for r in ranks])
        columns.append((after - base) / step)
    return base, np.stack(columns, axis=1)


def nonnegative_fit(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares `design @ x ≈ target` with x ≥ 0: the most negative coefficient is held
    at zero and the rest refitted, until none is negative."""
    free = np.ones(design.shape[1], dtype=bool)
    while True:
        x = np.zeros(design.shape[1])
        x[free] = np.linalg.lstsq(design[:, free], target, rcond=None)[0]
        if (x >= 0).all():
            return x
        free[int(np.argmin(x))] = False
