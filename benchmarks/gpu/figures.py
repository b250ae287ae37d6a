"""Figures from the runs' rows and the models' dims: parameter counts, FLOPs and MFU, the
largest safe fixed micro-batch size, memory at a step and its fit over the token cap, the loss
comparison, the fp16 run's summary. Pure, tested on CPU."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .settings import GRAD_NORM_RTOL, H200_BF16_DENSE_PEAK, LOSS_RTOL, MEMORY_STEP, REPO


def load_dims(name: str) -> Any:
    """ModelDims of conf/model/<name>.yaml."""
    import yaml

    from slime_hydra.schedule.cost import ModelDims

    text = (REPO / "conf/model" / f"{name}.yaml").read_text()
    return ModelDims.from_mapping(yaml.safe_load(text))


def param_count(dims: Any, tp: int = 1, vocab_multiple: int = 128) -> int:
    """Parameters of megatron's GPTModel for `dims` (local or TE spec, no biases but QKV's).

    Embedding Vp·h (Vp: vocab padded to a multiple of vocab_multiple × tp, as the trainer pads
    it), an output layer Vp·h only when untied; per layer: QKV h·(n·d + 2·g·d) plus its bias
    (n·d + 2·g·d) if add_qkv_bias, output projection n·d·h, MLP (2 or 1)·f·h + f·h, two norms
    (h each for RMSNorm, 2h for LayerNorm); a final norm.
    """
    h, n, g, d, f = (
        dims.hidden_size,
        dims.num_attention_heads,
        dims.num_query_groups,
        dims.head_dim,
        dims.ffn_hidden_size,
    )
    multiple = vocab_multiple * tp
    vocab = -(-dims.vocab_size // multiple) * multiple
    norm = h if dims.normalization == "RMSNorm" else 2 * h
    qkv = n * d + 2 * g * d
    layer = h * qkv + (qkv if dims.add_qkv_bias else 0) + n * d * h
    layer += ((2 if dims.swiglu else 1) * f * h + f * h) + 2 * norm
    embeddings = vocab * h * (2 if dims.untie_embeddings_and_output_weights else 1)
    return embeddings + dims.num_layers * layer + norm


def largest_safe_micro_batch_size(lengths: Sequence[int], cap: int, per_rank: int) -> int:
    """The largest micro_batch_size m for fixed batching that can never exceed `cap` tokens:
    m divides the rank's `per_rank` samples of a step and the m longest samples of the whole
    rollout fit together (so any grouping of any step fits, whatever the balancing does)."""
    longest = sorted(lengths, reverse=True)
    best = 0
    for m in range(1, min(per_rank, len(longest)) + 1):
        if sum(longest[:m]) > cap:
            break
        if per_rank % m == 0:
            best = m
    if best == 0:
        raise ValueError(f"the longest sample ({longest[0]} tokens) is over the cap {cap}")
    return best


def sequence_flops(lengths: Iterable[int], coefficients: tuple[int, int]) -> int:
    """Model FLOPs (forward + backward) of causal sequences: Σ a·L + b·L² (schedule/cost.py)."""
    a, b = coefficients
    return sum(a * n + b * n * n for n in lengths)


def step_flops(schedule: Mapping[str, Any], step: int, coefficients: tuple[int, int]) -> int:
    """Model FLOPs of step `step` (counted from 1, in metrics.jsonl as in schedule.json) of a
    run's schedule.json: every sample of every rank."""
    lengths = schedule["lengths"]
    entry = next(s for s in schedule["steps"] if s["step"] == step)
    samples = [i for rank in entry["ranks"] for mb in rank for i in mb]
    return sequence_flops((lengths[i] for i in samples), coefficients)


def mfu(flops: float, seconds: float, peak: float = H200_BF16_DENSE_PEAK, gpus: int = 1) -> float:
    """Model FLOPs utilisation: flops / seconds / (peak × gpus)."""
    return flops / seconds / (peak * gpus)


def _max_key(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return max(values) if values else None


def memory_at(rows: Sequence[Mapping[str, Any]], step: int = MEMORY_STEP) -> dict[str, Any] | None:
    """Peak CUDA memory of step `step` of a run (allocated and reserved, GiB, as the trainer
    logs them) with that step's largest micro-batch; None when the run has no such row."""
    row = next((r for r in rows if r["step"] == step), None)
    if row is None or row.get("perf/max_memory_gib") is None:
        return None
    return {
        "step": step,
        "allocated_gib": row["perf/max_memory_gib"],
        "reserved_gib": row.get("perf/max_memory_reserved_gib"),
        "mb_tokens_max": row.get("batch/mb_tokens_max"),
    }


def summarize_run(
    rows: Sequence[Mapping[str, Any]],
    schedule: Mapping[str, Any] | None,
    coefficients: tuple[int, int],
    warmup: int = 1,
    peaks: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Throughput of a run's metrics.jsonl rows, steps after the first `warmup` ones (all rows
    when there are no more): tokens/s = Σ tokens / Σ step_s, MFU = Σ model FLOPs / Σ step_s
    over each peak in `peaks` (name → FLOP/s); micro-batch shape; memory at MEMORY_STEP."""
    peaks = {"h200_dense_bf16_990": H200_BF16_DENSE_PEAK} if peaks is None else peaks
    timed = list(rows[warmup:]) or list(rows)
    out: dict[str, Any] = {
        "steps": len(rows),
        "timed_steps": [r["step"] for r in timed],
        "memory": memory_at(rows),
        "mb_tokens_max": _max_key(rows, "batch/mb_tokens_max"),
        "cap_violations": sum(r.get("batch/cap_violations", 0) for r in rows),
    }
    if not timed:
        return out
    seconds = sum(r["perf/step_s"] for r in timed)
    tokens = sum(r["perf/tokens_per_s"] * r["perf/step_s"] for r in timed)
    out.update(
        step_s=seconds / len(timed),
        tokens_per_s=tokens / seconds,
        num_microbatches=sum(r["batch/num_microbatches"] for r in timed) / len(timed),
        token_imbalance=sum(r.get("batch/token_imbalance", 1.0) for r in timed) / len(timed),
        loss=[r.get("train/loss") for r in rows],
    )
    if schedule is not None:
        flops = sum(step_flops(schedule, r["step"], coefficients) for r in timed)
        out["model_tflops_per_s"] = flops / seconds / 1e12
        out["mfu"] = {name: mfu(flops, seconds, peak) for name, peak in peaks.items()}
    return out


def compare_losses(
    gpu_rows: Sequence[Mapping[str, Any]],
    cpu_rows: Sequence[Mapping[str, Any]],
    steps: Sequence[int] = (1, 2),
    rtol: float = LOSS_RTOL,
    grad_rtol: float = GRAD_NORM_RTOL,
) -> dict[str, Any]:
    """train/loss and train/grad_norm of both trainers at `steps`, each checked: the check
    passes only when both agree at every step."""

    def at(rows: Sequence[Mapping[str, Any]], step: int, key: str) -> float | None:
        return next((r.get(key) for r in rows if r["step"] == step), None)

    def rel(x: float | None, y: float | None) -> float | None:
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
            return None
        return abs(x - y) / max(abs(y), 1e-12)

    per_step = []
    for s in steps:
        gl, cl = at(gpu_rows, s, "train/loss"), at(cpu_rows, s, "train/loss")
        gg, cg = at(gpu_rows, s, "train/grad_norm"), at(cpu_rows, s, "train/grad_norm")
        loss_rel, grad_rel = rel(gl, cl), rel(gg, cg)
        per_step.append(
            {
                "step": s,
                "gpu_loss": gl,
                "cpu_loss": cl,
                "loss_rel_diff": loss_rel,
                "loss_ok": loss_rel is not None and loss_rel <= rtol,
                "gpu_grad_norm": gg,
                "cpu_grad_norm": cg,
                "grad_norm_rel_diff": grad_rel,
                "grad_norm_ok": grad_rel is not None and grad_rel <= grad_rtol,
            }
        )
    return {
        "loss_rtol": rtol,
        "grad_norm_rtol": grad_rtol,
        "steps": per_step,
        "passed": bool(per_step) and all(p["loss_ok"] and p["grad_norm_ok"] for p in per_step),
    }


def memory_fit(points: Sequence[tuple[float, float]]) -> dict[str, float] | None:
    """Least-squares line GiB = base + per_1k × (tokens / 1000) through (tokens, GiB) points of
    one model's runs (largest micro-batch, peak memory); None for fewer than 2 distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    xs = [x / 1000 for x, _ in points]
    ys = [y for _, y in points]
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return {"base_gib": my - slope * mx, "gib_per_1k_tokens": slope}


def tokens_that_fit(fit: Mapping[str, float], gib: float) -> int:
    """Largest micro-batch (tokens) the fitted line keeps under `gib` of device memory."""
    return int((gib - fit["base_gib"]) / fit["gib_per_1k_tokens"] * 1000)


def fp16_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Whether fp16 trains: a step applies once the loss scale has come down (a step is applied
    when train/skipped_steps, a running count, does not grow), every loss finite."""
    counts = [0, *(r["train/skipped_steps"] for r in rows)]
    steps = zip(rows, counts[:-1], counts[1:], strict=True)
    applied = [r["step"] for r, before, now in steps if now == before]
    losses = [r.get("train/loss") for r in rows]
    finite = all(x is not None and math.isfinite(x) for x in losses)
    return {
        "steps": len(rows),
        "skipped_steps": counts[-1],
        "first_applied_step": applied[0] if applied else None,
        "applied_steps": len(applied),
        "loss_scales": [r.get("train/loss_scale") for r in rows],
        "passed": bool(applied) and finite,
    }


def calibration_summary(
    calibration: Mapping[str, Any], run: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The GPU's calibrated terms (with standard errors), how well they explain their own grid,
    and measured over predicted step time (perf/sim_ratio) of the dynamic run trained with
    them, its first step a warm-up: issue 18's ±15% on the device."""
    grid = [s["step_s"] / s["predicted_step_s"] for s in calibration.get("samples") or []]
    rows = (run or {}).get("rows") or []
    ratios = [r["perf/sim_ratio"] for r in rows[1:] if r.get("perf/sim_ratio") is not None]
    return {
        "device": calibration.get("device"),
        "terms": calibration.get("terms"),
        "stderr": calibration.get("stderr"),
        "grid_meas_over_pred_median": statistics.median(grid) if grid else None,
        "run_status": (run or {}).get("status"),
        "run_meas_over_sim": ratios,
        "run_meas_over_sim_median": statistics.median(ratios) if ratios else None,
        "within_15pct": all(0.85 <= r <= 1.15 for r in ratios) if ratios else None,
    }
