"""The CLI runs of the check (loss, throughput, memory, fp16): their overrides and command
lines, and why one is skipped. Pure, tested on CPU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .settings import (
    CALIBRATION_FILE,
    CALIBRATION_MIN_TOKENS,
    CALIBRATION_REPEATS,
    FP16_GBS,
    FP16_STEPS,
    LOSS_DATA,
    LOSS_GBS,
    LOSS_LR,
    LOSS_STEPS,
    MEMORY_CAPS,
    MEMORY_STEP,
    SEED,
    THROUGHPUT_CAP,
    THROUGHPUT_DATA,
    THROUGHPUT_GBS,
    THROUGHPUT_MODEL,
    THROUGHPUT_STEPS,
    TINY,
)


@dataclass(frozen=True)
class RunSpec:
    """One `python -m slime_hydra` run of the check."""

    name: str
    group: str
    """loss | throughput | memory"""
    overrides: tuple[str, ...]
    timeout_s: float
    stop_after_rows: int | None = None
    """Stop the run once metrics.jsonl holds this many rows: the trainer checkpoints after its
    last step (~21 GB of weights and Adam state for 1.5B parameters), which the check skips."""
    cap: int | None = None
    calibrates: bool = False
    """python -m slime_hydra.calibrate, writing CALIBRATION_FILE into the run dir, instead of
    the app."""


def cli_command(python: str, run_dir: Path | str, spec: RunSpec) -> list[str]:
    """The command line of one run: the app with its run dir, or the calibration with its file
    in the run dir; then the overrides."""
    if spec.calibrates:
        out = Path(run_dir) / CALIBRATION_FILE
        head = ["-m", "slime_hydra.calibrate", "--out", str(out)]
        head += ["--repeats", str(CALIBRATION_REPEATS), "--max-tokens", str(spec.cap)]
        head += ["--min-tokens", str(CALIBRATION_MIN_TOKENS)]
    else:
        head = ["-m", "slime_hydra", f"hydra.run.dir={run_dir}"]
    return [python, *head, *spec.overrides]


def data_overrides(data: Mapping[str, Any], global_batch_size: int) -> list[str]:
    """synthetic_grpo data settings and the step size."""
    return [
        "data=synthetic_grpo",
        *(f"data.{k}={v}" for k, v in data.items()),
        f"batching.global_batch_size={global_batch_size}",
    ]


def loss_runs(timeout_s: float = 150) -> list[RunSpec]:
    """trainer=gpu and trainer=cpu on the tiny model, fp32, same rollout, seed and lr, 2 steps."""
    common = [
        "logger=jsonl",
        "parallel.dp=1",
        f"model={TINY}",
        f"seed={SEED}",
        f"trainer.lr={LOSS_LR}",
        "batching=dynamic",
        *data_overrides(LOSS_DATA, LOSS_GBS),
        f"trainer.max_steps={LOSS_STEPS}",
    ]
    return [
        RunSpec(
            "loss_gpu_fp32",
            "loss",
            ("trainer=gpu", *common, "trainer.params_dtype=float32"),
            timeout_s,
        ),
        RunSpec("loss_cpu_fp32", "loss", ("trainer=cpu", *common), timeout_s),
    ]


def throughput_runs(
    safe_mbs: int,
    cap: int = THROUGHPUT_CAP,
    memory_caps: Sequence[int] = MEMORY_CAPS,
    steps: int = THROUGHPUT_STEPS,
    timeout_s: float = 150,
    memory_timeout_s: float = 110,
) -> list[RunSpec]:
    """Dynamic and safe fixed batching at `cap` (steps each, the first a warm-up), then
    MEMORY_STEP steps of dynamic batching at each of `memory_caps` for its peak memory."""
    common = throughput_overrides()
    runs = [
        RunSpec(f"dynamic_cap{cap}", "throughput", dynamic(cap, steps), timeout_s, steps, cap),
        RunSpec(
            f"fixed_mbs{safe_mbs}_cap{cap}",
            "throughput",
            (
                *common,
                "batching=fixed",
                f"batching.micro_batch_size={safe_mbs}",
                f"batching.max_tokens_per_gpu={cap}",
                f"trainer.max_steps={steps}",
            ),
            timeout_s,
            steps,
            cap,
        ),
    ]
    for c in memory_caps:
        runs.append(
            RunSpec(
                f"dynamic_cap{c}",
                "memory",
                dynamic(c, MEMORY_STEP),
                memory_timeout_s,
                MEMORY_STEP,
                c,
            )
        )
    return runs


def model_overrides() -> list[str]:
    """THROUGHPUT_MODEL on one GPU: what its runs and its calibration share."""
    return [
        "trainer=gpu",
        "logger=jsonl",
        "parallel.dp=1",
        f"model={THROUGHPUT_MODEL}",
        f"seed={SEED}",
    ]


def throughput_overrides() -> list[str]:
    """What every run of THROUGHPUT_MODEL on its rollout shares."""
    return [*model_overrides(), *data_overrides(THROUGHPUT_DATA, THROUGHPUT_GBS)]


def dynamic(cap: int, steps: int) -> tuple[str, ...]:
    """The throughput rollout under dynamic batching at `cap`, `steps` steps."""
    return (
        *throughput_overrides(),
        "batching=dynamic",
        f"batching.max_tokens_per_gpu={cap}",
        f"trainer.max_steps={steps}",
    )


CALIBRATION_RUN = "calibration"
"""The calibration's run name, and its run dir under the check's runs."""


def calibration_file(runs_root: Path) -> Path:
    """Where the calibration run writes its file (its run dir under `runs_root`)."""
    return runs_root / CALIBRATION_RUN / CALIBRATION_FILE


def calibration_runs(
    runs_root: Path,
    cap: int = THROUGHPUT_CAP,
    steps: int = THROUGHPUT_STEPS,
    timeout_s: float = 300,
) -> list[RunSpec]:
    """The calibration of THROUGHPUT_MODEL on this GPU up to `cap` (python -m
    slime_hydra.calibrate, in runs_root/calibration), then the dynamic throughput run again with
    it as trainer.cost: its perf/sim_ratio is how right the calibrated model is on the device."""
    cost = f"trainer.cost={calibration_file(runs_root)}"
    return [
        RunSpec(
            CALIBRATION_RUN,
            "calibration",
            tuple(model_overrides()),
            timeout_s,
            cap=cap,
            calibrates=True,
        ),
        RunSpec(
            f"dynamic_cap{cap}_calibrated",
            "calibration",
            (*dynamic(cap, steps), cost),
            150,
            steps,
            cap,
        ),
    ]


def fp16_run(timeout_s: float = 120) -> RunSpec:
    """trainer=gpu on the tiny model in float16, FP16_STEPS small steps."""
    return RunSpec(
        "fp16_tiny",
        "fp16",
        (
            "trainer=gpu",
            "logger=jsonl",
            "parallel.dp=1",
            f"model={TINY}",
            f"seed={SEED}",
            "batching=dynamic",
            *data_overrides(LOSS_DATA, FP16_GBS),
            f"trainer.max_steps={FP16_STEPS}",
            "trainer.params_dtype=float16",
        ),
        timeout_s,
    )


def skip_reason(spec: RunSpec, records: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why a memory run need not start: an earlier run of the model failed or timed out (it
    would fail the same way), or a smaller cap already ran out of memory. None: run it."""
    if spec.group != "memory":
        return None
    for name, rec in records.items():
        if rec.get("group") not in ("throughput", "memory"):
            continue
        if rec["status"] in ("failed", "timeout"):
            return f"{name} {rec['status']}"
        if rec["status"] == "oom" and (rec.get("cap") or 0) <= (spec.cap or 0):
            return f"{name} ran out of memory at a cap of {rec.get('cap')} tokens"
    return None
