"""`python -m slime_hydra.calibrate [--out FILE] [--repeats N] [--max-tokens N]
[--min-tokens N] [--max-microbatches N] [overrides ...]`:
measure the step cost model (schedule/steptime.py) of the configured model and layout on this
machine and write the calibration file (calibration.py) that trainer.cost=FILE loads.

The overrides compose the config exactly as `python -m slime_hydra` does (model=..., parallel.*,
trainer=cpu|gpu, trainer.nproc_per_node, ...). Workers start as a training run's do (the elastic
launcher of train/run/launch.py, the same engine, backend and dtype) and train on the
calibration grid (calibration.calibration_grid) instead of the rollout: every composition once
as a warm-up step, then `--repeats` times in alternating order. Per step they time the step as
the training loop times perf/step_s, the part of it in megatron's schedule, and the gradient
all-reduce inside it (finalize_model_grads); with pp > 1 they also time the exchange between
pipeline stages on its own (p2p_s). The fit (calibration.fit_step_cost) gives the per-token,
per-L², per-sequence and per-micro-batch terms from the schedule's time, the all-reduce and the
optimizer step (with the iterator and whatever else is outside the schedule) as medians.

What the model leaves out: the p2p term is one cost per exchange whatever its size (activations
grow with tokens); compute per token is taken as constant across micro-batch sizes (no cache
or kernel-efficiency curve beyond the L² term); overlap of communication with compute is not
modelled; the all-reduce holds for the dp it was measured at.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from slime_hydra.__main__ import CONF_DIR
from slime_hydra.calibration import (
    calibration_grid,
    calibration_json,
    fit_step_cost,
    sample_ranks,
)
from slime_hydra.config import job_of, validate
from slime_hydra.data.rollout import RolloutBatch, with_tokens
from slime_hydra.errors import SlimeHydraError, raise_stopped, stop_signal
from slime_hydra.files import write_file
from slime_hydra.instantiate import build
from slime_hydra.log.sink import RunInfo
from slime_hydra.schedule import Schedule, StepSchedule
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.steptime import StepCost, simulate_step
from slime_hydra.train.job import Job
from slime_hydra.train.run.start import check
from slime_hydra.train.settings import CpuTrainer, PlanTrainer

log = logging.getLogger("slime_hydra.calibrate")

UNITS = {
    "token_s": "s/token",
    "square_s": "s/token²",
    "microbatch_s": "s/micro-batch",
    "sequence_s": "s/sequence",
    "microbatch_square_s": "s/(micro-batch token)²",
    "p2p_s": "s/exchange",
    "allreduce_s": "s/step",
    "optimizer_s": "s/step",
}


def grid_order(size: int, repeats: int) -> list[int]:
    """The grid's entries in the order they run: each once as warm-up, then `repeats` passes,
    forwards and backwards in turn, so that drift over the run spreads over all of them."""
    forwards = list(range(size))
    passes = [forwards if r % 2 == 0 else forwards[::-1] for r in range(repeats)]
    return forwards + [i for p in passes for i in p]


def grid_job(
    cfg: DictConfig, run_dir: Path, grid: list[tuple[int, list[int]]], order: list[int]
) -> Job:
    """The planned job whose rollout and schedule are the grid's steps in `order`, with every
    DP rank given the same micro-batches (fresh samples each, half prompt, half response)."""
    checked = validate(cfg)
    layout, dims = checked.layout, checked.dims
    lengths: list[int] = []
    steps = []
    for index, entry in enumerate(order):
        count, microbatch = grid[entry]
        ranks = []
        for rank in sample_ranks({"num_microbatches": count, "microbatch": microbatch}, layout.dp):
            ranks.append([])
            for mb in rank:
                ranks[-1].append(list(range(len(lengths), len(lengths) + len(mb))))
                lengths += mb
        steps.append(StepSchedule.build(index, ranks))
    total = np.array(lengths, dtype=np.int64)
    rollout = RolloutBatch(total, total // 2, np.arange(total.size))
    schedule = Schedule(tuple(lengths), None, tuple(steps))
    run = RunInfo(run_dir, OmegaConf.to_container(cfg, resolve=True), "calibrate", None, "cal")
    rollout = with_tokens(rollout, dims.vocab_size, cfg.seed)
    return job_of(cfg, checked, run, rollout, schedule)


def device_name(trainer: CpuTrainer) -> str:
    """The machine the calibration ran on, in words."""
    cores = f"{platform.machine()}, {os.cpu_count()} cores"
    if trainer.device != "cuda":
        return f"cpu ({trainer.backend}): {cores}"
    import torch

    return f"cuda ({trainer.backend}): {torch.cuda.get_device_name()}, host {cores}"


def timed_samples(
    grid: list[tuple[int, list[int]]], order: list[int], timings: list[list[float]]
) -> list[dict[str, Any]]:
    """Each grid entry with the medians of its timed runs (its warm-up left out) and the
    spread of its pipeline seconds."""
    runs: dict[int, list[list[float]]] = {i: [] for i in range(len(grid))}
    for entry, timing in list(zip(order, timings, strict=True))[len(grid) :]:
        runs[entry].append(timing)
    samples = []
    for entry, (count, microbatch) in enumerate(grid):
        step_s, schedule_s, reduce_s = np.array(runs[entry]).T
        pipeline_s = schedule_s - reduce_s
        samples.append(
            {
                "num_microbatches": count,
                "microbatch": microbatch,
                "pipeline_s": float(np.median(pipeline_s)),
                "pipeline_spread_s": [float(pipeline_s.min()), float(pipeline_s.max())],
                "allreduce_s": float(np.median(reduce_s)),
                "optimizer_s": float(np.median(step_s - schedule_s)),
                "step_s": float(np.median(step_s)),
                "repeats": len(step_s),
            }
        )
    return samples


def calibrate(
    cfg: DictConfig,
    out: Path | None,
    repeats: int,
    max_tokens: int,
    max_microbatches: int | None = None,
    min_tokens: int | None = None,
) -> StepCost:
    """Time the grid in this config's workers, fit, write the calibration file to `out`
    (None: default_out)."""
    if repeats < 2:
        raise SlimeHydraError(
            f"--repeats={repeats}: the spread and the standard errors need at least 2 "
            "timed passes over the grid; pass --repeats 3."
        )
    trainer = build(cfg.trainer)
    if isinstance(trainer, PlanTrainer):
        raise SlimeHydraError(
            "python -m slime_hydra.calibrate times the real engine, which trainer=plan does not "
            "run: pass trainer=cpu or trainer=gpu."
        )
    checked = validate(cfg)
    layout = checked.layout
    out = out or default_out(cfg.model.name, layout)
    grid = calibration_grid(
        layout, max_tokens, max_microbatches, checked.dims.max_position_embeddings, min_tokens
    )
    order = grid_order(len(grid), repeats)
    from slime_hydra.train.run.calibrate import TIMINGS  # torch: once the config is checked
    from slime_hydra.train.run.launch import start_workers

    with tempfile.TemporaryDirectory(prefix="slime_hydra_calibrate_") as tmp:
        job = grid_job(cfg, Path(tmp), grid, order)
        check(trainer, job)
        log.info(
            "Calibrating %s on %s: %d grid steps × %d passes (+ warm-up), micro-batches of "
            "%d to %d tokens",
            job.dims.name,
            layout,
            len(grid),
            repeats,
            min(sum(mb) for _, mb in grid),
            max_tokens,
        )
        start_workers(trainer, job, "slime_hydra.train.run.calibrate:measure")
        timings = json.loads((Path(tmp) / TIMINGS).read_text())
    samples = timed_samples(grid, order, timings["steps"])
    exchange_s = timings["exchange_s"]
    cost, stderr = fit_step_cost(samples, layout, job.cost, str(out), exchange_s)
    for sample in samples:
        ranks = sample_ranks(sample, layout.dp)
        sample["predicted_step_s"] = simulate_step(ranks, layout, cost).step_s
    device = device_name(trainer)
    text = calibration_json(cost, stderr, job.dims.name, device, layout, samples, exchange_s)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_file(out, text, out.parent)
    report(cost, stderr, samples, out)
    return cost


def report(cost: StepCost, stderr: dict[str, float], samples: list[dict], out: Path) -> None:
    """The terms with their units and standard errors, and how well they explain the steps."""
    for name, unit in UNITS.items():
        error = stderr.get(name)
        plus = "(not measured: pp=1)" if error is None else f"± {error:.3g}"
        log.info("  %-13s %.4g %s %s", name, getattr(cost, name), plus, unit)
    ratios = [s["step_s"] / s["predicted_step_s"] for s in samples]
    log.info(
        "measured/predicted step time over the %d grid steps: median %.3f, range %.3f–%.3f; "
        "wrote %s (load it with trainer.cost=%s)",
        len(samples),
        statistics.median(ratios),
        min(ratios),
        max(ratios),
        out,
        out,
    )


def default_out(model: str, layout: ParallelLayout) -> Path:
    """outputs/calibration/<model>-dp…-tp…-pp…-vpp…-cp….json."""
    shape = "-".join(f"{k}{getattr(layout, k)}" for k in ("dp", "tp", "pp", "vpp", "cp"))
    return Path("outputs") / "calibration" / f"{model}-{shape}.json"


def main(argv: list[str] | None = None) -> None:
    """Parse the options, compose the config from the overrides, calibrate; a user error is
    one paragraph and exit 1."""
    parser = argparse.ArgumentParser(prog="python -m slime_hydra.calibrate", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--out", type=Path, default=None, help="the calibration file to write")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over the grid")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=2048,
        help="tokens of the largest micro-batch timed: up to the cap the runs pack to "
        "(batching.max_tokens_per_gpu × parallel.cp)",
    )
    parser.add_argument(
        "--min-tokens",
        type=int,
        default=None,
        help="tokens of the smallest micro-batch timed (default --max-tokens/8): down to the "
        "smallest the runs take, as the fit extrapolates badly below it",
    )
    parser.add_argument(
        "--max-microbatches",
        type=int,
        default=None,
        help="the most micro-batches per step timed (default 4 VPP groups): up to what the runs "
        "take (batch/num_microbatches), as the fit extrapolates badly beyond it",
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, as python -m slime_hydra")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    signal.signal(signal.SIGTERM, raise_stopped)
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("config", overrides=args.overrides)
        calibrate(
            cfg, args.out, args.repeats, args.max_tokens, args.max_microbatches, args.min_tokens
        )
    except SlimeHydraError as exc:
        log.error("%s", exc)
        sys.exit(1)
    except BaseException as exc:  # a stop (Ctrl-C, SIGTERM, the launcher's), or a failure
        signum = stop_signal(exc)
        if signum is None:
            raise
        name = signal.Signals(signum).name
        log.error("calibration stopped by %s: no calibration file was written.", name)
        sys.exit(128 + signum)


if __name__ == "__main__":
    main()
