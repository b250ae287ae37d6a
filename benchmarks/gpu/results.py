"""The result JSON (gpu_check.json) from the probe's answer and each run's record, and the
table the check prints. Pure, tested on CPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .figures import (
    calibration_summary,
    compare_losses,
    fp16_summary,
    memory_at,
    memory_fit,
    summarize_run,
    tokens_that_fit,
)
from .settings import (
    CARD_GIB,
    H200_BF16_DENSE_PEAK,
    MEMORY_STEP,
    THROUGHPUT_CAP,
    THROUGHPUT_MODEL,
)


def assemble_results(
    *,
    date: str,
    elapsed_s: float,
    probe: Mapping[str, Any] | None,
    runs: Mapping[str, Mapping[str, Any]],
    coefficients: tuple[int, int],
    params: int,
    safe_mbs: int,
    rollout: Mapping[str, Any],
    card_gib: float = CARD_GIB,
    calibration: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The result JSON from the probe's answer, each run's record (status, rows, schedule) and
    the calibration file, if one was written."""
    measured = (probe or {}).get("device", {}).get("matmul_bf16_tflops")
    peaks = {"h200_dense_bf16_990": H200_BF16_DENSE_PEAK}
    if measured:
        peaks["measured_matmul_bf16"] = measured * 1e12
    card_gib = (probe or {}).get("device", {}).get("total_memory_gib") or card_gib

    def summary(name: str) -> dict[str, Any]:
        run = runs[name]
        out = {"status": run["status"], "cap": run.get("cap")}
        if run.get("rows"):
            out.update(summarize_run(run["rows"], run.get("schedule"), coefficients, 1, peaks))
        if run.get("nvidia_smi_peak_mib") is not None:
            out["nvidia_smi_peak_mib"] = run["nvidia_smi_peak_mib"]
        return out

    loss = None
    if "loss_gpu_fp32" in runs and "loss_cpu_fp32" in runs:
        loss = compare_losses(
            runs["loss_gpu_fp32"].get("rows") or [], runs["loss_cpu_fp32"].get("rows") or []
        )
    throughput = {n: summary(n) for n, r in runs.items() if r.get("group") == "throughput"}
    memory_names = [n for n, r in runs.items() if r.get("group") in ("throughput", "memory")]
    memory = []
    for n in memory_names:
        at = memory_at(runs[n].get("rows") or []) or {}
        memory.append(
            {
                "run": n,
                "batching": "fixed" if n.startswith("fixed") else "dynamic",
                "max_tokens_per_gpu": runs[n].get("cap"),
                "status": runs[n]["status"],
                "step": MEMORY_STEP,
                "mb_tokens_max": at.get("mb_tokens_max"),
                "allocated_gib": at.get("allocated_gib"),
                "reserved_gib": at.get("reserved_gib"),
                "nvidia_smi_peak_mib": runs[n].get("nvidia_smi_peak_mib"),
            }
        )
    memory.sort(key=lambda m: (m["max_tokens_per_gpu"] or 0, m["run"]))
    points = [
        (m["mb_tokens_max"], m["allocated_gib"])
        for m in memory
        if m["batching"] == "dynamic" and m["mb_tokens_max"] and m["allocated_gib"]
    ]
    fit = memory_fit(points)
    dyn = [v for n, v in throughput.items() if n.startswith("dynamic") and "tokens_per_s" in v]
    fix = [v for n, v in throughput.items() if n.startswith("fixed") and "tokens_per_s" in v]
    return {
        "check": "slime_hydra benchmarks/gpu_check.py",
        "date": date,
        "elapsed_s": round(elapsed_s, 1),
        "device": (probe or {}).get("device"),
        "peaks_flops": peaks,
        "peak_note": "MFU over the H200 SXM dense bf16 datasheet rate, 990 TFLOP/s (device docs "
        "H200.md), and over the bf16 matrix-product rate measured in this call",
        "attention": (probe or {}).get("attention"),
        "model_parity": (probe or {}).get("model_parity"),
        "params": {"model": THROUGHPUT_MODEL, "count": params},
        "probe_error": (probe or {}).get("error"),
        "loss_check": loss,
        "fp16": fp16_summary(runs["fp16_tiny"]["rows"]) if runs.get("fp16_tiny") else None,
        "throughput": {
            "model": THROUGHPUT_MODEL,
            "rollout": dict(rollout),
            "safe_micro_batch_size": safe_mbs,
            "runs": throughput,
            "dynamic_over_fixed": (
                dyn[0]["tokens_per_s"] / fix[0]["tokens_per_s"] if dyn and fix else None
            ),
        },
        "memory": {
            "runs": memory,
            "fit": fit,
            "card_gib": card_gib,
            "tokens_fitting_card": tokens_that_fit(fit, card_gib) if fit else None,
        },
        "calibration": (
            calibration_summary(calibration, runs.get(f"dynamic_cap{THROUGHPUT_CAP}_calibrated"))
            if calibration
            else None
        ),
        "runs": {n: {k: v for k, v in r.items() if k != "schedule"} for n, r in runs.items()},
    }


def result_table(results: Mapping[str, Any]) -> str:
    """A short text table of the headline figures."""
    lines = [f"gpu_check {results['date']} ({results['elapsed_s']} s)"]
    device = results.get("device") or {}
    if device:
        lines.append(
            f"device {device.get('name')}  torch {device.get('torch')}  "
            f"bf16 matmul {device.get('matmul_bf16_tflops')} TFLOP/s  TE {device.get('te')}"
        )
    att = results.get("attention") or {}
    if att:
        lines.append(
            f"attention {att.get('kernel')}: passed={att.get('passed')}  "
            f"cross-boundary max |Δ| {att.get('cross_boundary_max_abs')}"
        )
    par = results.get("model_parity") or {}
    if par:
        lines.append(f"model parity cuda vs cpu: passed={par.get('passed')}")
    loss = results.get("loss_check") or {}
    for s in loss.get("steps", []):
        lines.append(
            f"loss step {s['step']}: gpu {s['gpu_loss']} cpu {s['cpu_loss']} "
            f"rel {s['loss_rel_diff']} ok={s['loss_ok']}  grad_norm gpu {s['gpu_grad_norm']} "
            f"cpu {s['cpu_grad_norm']} rel {s['grad_norm_rel_diff']} ok={s['grad_norm_ok']}"
        )
    fp16 = results.get("fp16") or {}
    if fp16:
        lines.append(
            f"fp16 tiny: passed={fp16['passed']}  first applied step "
            f"{fp16['first_applied_step']} of {fp16['steps']}, {fp16['skipped_steps']} skipped"
        )
    lines.append(f"{'run':<26}{'status':>10}{'mb/step':>9}{'tok/s':>10}{'MFU990':>8}{'GiB':>8}")
    for name, r in (results.get("throughput") or {}).get("runs", {}).items():
        lines.append(
            f"{name:<26}{r['status']:>10}{_fmt(r.get('num_microbatches'), 1):>9}"
            f"{_fmt(r.get('tokens_per_s'), 0):>10}"
            f"{_fmt((r.get('mfu') or {}).get('h200_dense_bf16_990'), 3):>8}"
            f"{_fmt((r.get('memory') or {}).get('allocated_gib'), 1):>8}"
        )
    for m in (results.get("memory") or {}).get("runs", []):
        lines.append(
            f"memory cap {m['max_tokens_per_gpu']:>6} ({m['batching']}): {m['status']}, step "
            f"{m['step']}: largest mb {m['mb_tokens_max']} tokens, peak allocated "
            f"{_fmt(m['allocated_gib'], 1)} GiB, reserved {_fmt(m['reserved_gib'], 1)} GiB"
        )
    cal = results.get("calibration") or {}
    if cal:
        grid, run = cal["grid_meas_over_pred_median"], cal["run_meas_over_sim_median"]
        lines.append(
            f"calibration on {cal['device']}: grid meas/pred {_fmt(grid, 3)}, calibrated run "
            f"meas/sim {_fmt(run, 3)} (within ±15%: {cal['within_15pct']})"
        )
    return "\n".join(lines)


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
