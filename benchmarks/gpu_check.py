"""trainer=gpu on one GPU (an H200 lent through the `device` tool): one prepared check.

On the device machine, from the repository root (docs/gpu.md has the exact `run` call):
    bash benchmarks/gpu_check.sh            # installs the packages (carried wheels, or
                                            # `pip install -e .`), then `check`
Here, to fetch wheels for a machine without package registries first:
    bash benchmarks/gpu_wheels.sh           # uses `python3 benchmarks/gpu_check.py wheels REPORT`

`check` runs, inside one time budget (default 400 s; `--only` picks parts for a rerun), the
headline figures first:
1. loss: `python -m slime_hydra trainer=gpu parallel.dp=1 model=tiny` in fp32 for 2 steps
   against `trainer=cpu` on the same rollout, seed and lr (the CPU run goes alongside). Both
   draw the same initial weights on the CPU (`init_weights`), and the rollout's synthesized
   tokens carry the noise model's log-probs (data/tokens.py), so the ratio is not 1 and both
   train/loss and train/grad_norm depend on the model: each must agree to LOSS_RTOL /
   GRAD_NORM_RTOL at steps 1 and 2 (step 2 after one AdamW update on each device).
2. throughput: Qwen2.5-1.5B's shape (conf/model/qwen2_5_1_5b.yaml, random weights) on a GRPO-like
   rollout, dynamic batching against fixed batching at the largest safe micro_batch_size;
   tokens/s and MFU (model FLOPs per second over the H200's dense bf16 peak, 990 TFLOP/s, the
   datasheet figure of the device docs' H200.md; also over the rate measured in the probe).
3. memory: peak CUDA memory (allocated and reserved) at step 2, when Adam's moments exist (torch
   creates them in the first step()), per batching.max_tokens_per_gpu, up to a cap whose
   micro-batches no longer fit the card (or nearly do): why the cap matters.
4. fp16: the tiny model in float16 for 30 small steps: megatron's loss scale must come down
   from 2**32 until an update applies, every loss finite.
5. probe, in a child process: device, versions, a bf16 matrix-product rate; PackedCausalAttention
   on CUDA against a float64 reference, and proof that no token attends across a packed sequence
   boundary; the tiny GPTModel on CUDA against the same weights on CPU (logits, gradients),
   packed against one sequence at a time.
Results: $OUT/gpu_check.json (every run's metrics rows included), logs beside it.

The pure parts (MFU arithmetic, parameter count, the safe micro-batch size, command lines, the
comparisons, the memory points, the result JSON, the wheel list) are functions tested on CPU by
tests/unit/test_gpu_check.py. This module imports only the standard library at the top, so
`wheels` runs under any python3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

H200_BF16_DENSE_PEAK = 990e12
"""FLOP/s: the H200 SXM's dense bf16 rate, 'about 990 TFLOP/s' by the vendor's datasheet
(/work/.library/device/H200.md). MFU is model FLOPs per second over this figure."""
KINDS_MEASURED_BF16 = 788e12
"""FLOP/s: an 8192³ bf16 matrix product through PyTorch on random data on one H200 of this
workplace, 2026-10-28 (KINDS.md); `probe` measures it again."""
CARD_GIB = 139.0
"""GPU memory of the lent H200 (about 139 GiB by the device docs; `probe` reads the real one)."""

TINY = "tiny"
THROUGHPUT_MODEL = "qwen2_5_1_5b"
SEED = 1234
LOSS_LR = 1e-4
"""trainer.lr of both loss runs (the trainers' defaults differ: 1e-3 on CPU, 1e-6 on GPU)."""
LOSS_RTOL = 1e-4
GRAD_NORM_RTOL = 1e-4
"""train/loss and train/grad_norm of trainer=gpu (fp32) against trainer=cpu (fp32), same
weights, rollout and lr: only summation order and kernels differ."""
PARITY_RTOL = {"float32": 2e-3, "bfloat16": 2e-2}
"""‖cuda − cpu‖/‖cpu‖ of logits and gradients, same weights: fp32 (TF32 matmuls possible) and
bf16 weights and activations on CUDA against fp32 on CPU."""
ATTENTION_RTOL = {"float32": 1e-4, "bfloat16": 1e-2}
"""‖packed − reference‖/‖reference‖ per sequence, reference in float64 (METHOD.md's bounds)."""

# GRPO-like rollout of the throughput and memory runs: 32 prompts × 8 samples, 64 per step,
# prompts ~512 tokens (≤ 1024), responses ~1k (≤ 3072): the synthetic_grpo defaults.
THROUGHPUT_DATA: dict[str, Any] = {"num_prompts": 32, "n_samples_per_prompt": 8}
THROUGHPUT_GBS = 64
THROUGHPUT_STEPS = 3
"""A warm-up step, then two timed ones."""
THROUGHPUT_CAP = 8192
MEMORY_STEP = 2
"""Memory is read at this step of every run: the first one with Adam's moments allocated."""
MEMORY_CAPS = (32768, 16384)
"""max_tokens_per_gpu settings measured for peak memory (besides THROUGHPUT_CAP, from the
throughput runs), most telling first. 32768 tokens of a 152k vocabulary are 20 GB per fp32 copy
of the log-probs alone, on top of ~28 GB of weights, gradients and Adam state and ~1.5 MB of
activations per token: the setting where a micro-batch stops fitting the card (or nearly)."""
GROUPS = ("loss", "throughput", "memory", "fp16", "probe")
"""The parts of `check`, in the order they run: the headline figures first."""
PROBE_MIN_S = 40
"""Budget seconds the probe needs left to start (a CUDA context, two tiny models, attention)."""
LOSS_DATA: dict[str, Any] = {"num_prompts": 8, "n_samples_per_prompt": 8}
LOSS_GBS = 32
LOSS_STEPS = 2
FP16_GBS = 2
FP16_STEPS = 30
"""The fp16 run: 30 steps of 2 samples of LOSS_DATA, room for megatron's loss scale to come
down from 2**32 (one halving per overflow after the first two) before an update applies."""

# What the device's image holds already (KINDS.md, 'Python packages already there', read
# 2026-11-17): these are not carried, so the device's own versions are used.
_DEVICE_PACKAGE_NAMES = """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
    lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
    ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
    nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
    nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
    nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
    pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
    protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"""
DEVICE_PACKAGES = frozenset(_DEVICE_PACKAGE_NAMES.split())
NEVER_CARRY = re.compile(r"^(torch|triton|nvidia-.*|numpy)$")
"""Never downloaded, whatever the device lists: torch there is 2.11+cu130 with its CUDA stack."""


# ---------------------------------------------------------------------------------------------
# Pure parts (tested on CPU)
# ---------------------------------------------------------------------------------------------


def normalize(name: str) -> str:
    """A distribution name in PEP 503 form: 'PyYAML' → 'pyyaml', 'a_b.c' → 'a-b-c'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheels_to_fetch(report: Mapping[str, Any], skip: Iterable[str] = ()) -> list[str]:
    """`name==version` of each package in a `pip install --dry-run --report` that the device
    lacks: the resolved set minus DEVICE_PACKAGES, torch's stack, and `skip` (already built)."""
    skipped = {normalize(s) for s in skip}
    wanted = []
    for item in report["install"]:
        meta = item["metadata"]
        name = normalize(meta["name"])
        if name in DEVICE_PACKAGES or name in skipped or NEVER_CARRY.match(name):
            continue
        wanted.append(f"{name}=={meta['version']}")
    return sorted(wanted)


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


def cli_command(python: str, run_dir: Path | str, overrides: Sequence[str]) -> list[str]:
    """The command line of one run: the app, its run dir, the overrides."""
    return [python, "-m", "slime_hydra", f"hydra.run.dir={run_dir}", *overrides]


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
    common = [
        "trainer=gpu",
        "logger=jsonl",
        "parallel.dp=1",
        f"model={THROUGHPUT_MODEL}",
        f"seed={SEED}",
        *data_overrides(THROUGHPUT_DATA, THROUGHPUT_GBS),
    ]
    runs = [
        RunSpec(
            f"dynamic_cap{cap}",
            "throughput",
            (
                *common,
                "batching=dynamic",
                f"batching.max_tokens_per_gpu={cap}",
                f"trainer.max_steps={steps}",
            ),
            timeout_s,
            steps,
            cap,
        ),
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
                (
                    *common,
                    "batching=dynamic",
                    f"batching.max_tokens_per_gpu={c}",
                    f"trainer.max_steps={MEMORY_STEP}",
                ),
                memory_timeout_s,
                MEMORY_STEP,
                c,
            )
        )
    return runs


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
) -> dict[str, Any]:
    """The result JSON from the probe's answer and each run's record (status, rows, schedule)."""
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
    return "\n".join(lines)


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# ---------------------------------------------------------------------------------------------
# Running the CLI (device machine)
# ---------------------------------------------------------------------------------------------


class MemoryPoller:
    """Peak `nvidia-smi` memory.used (MiB, the whole card: CUDA contexts and allocator caches
    included) while a run goes: a fallback when perf/max_memory_gib is missing."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            try:
                used = int(
                    subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.split()[0]
                )
                self.peak = max(self.peak or 0, used)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemoryPoller:
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows (a half-written last line is skipped)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


def _kill_group(proc: subprocess.Popen) -> None:
    """End the run's process group (the app and the workers it started), TERM then KILL."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 20)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


class Runner:
    """Starts runs of the app under one deadline and keeps their records."""

    def __init__(self, root: Path, log_dir: Path, deadline: float) -> None:
        self.root, self.log_dir, self.deadline = root, log_dir, deadline
        self.records: dict[str, dict[str, Any]] = {}

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def start(self, spec: RunSpec) -> tuple[subprocess.Popen, Path, float, Any]:
        run_dir = self.root / spec.name
        shutil.rmtree(run_dir, ignore_errors=True)
        log = (self.log_dir / f"run_{spec.name}.log").open("w")
        cmd = cli_command(sys.executable, run_dir, spec.overrides)
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="1", WANDB_MODE="disabled")
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        print(f"[gpu_check] {spec.name}: started ({self.remaining():.0f} s left)", flush=True)
        return proc, run_dir, time.monotonic(), log

    def finish(
        self,
        spec: RunSpec,
        proc: subprocess.Popen,
        run_dir: Path,
        began: float,
        log: Any,
        poller: MemoryPoller | None = None,
    ) -> dict[str, Any]:
        limit = min(spec.timeout_s, max(self.remaining(), 1.0))
        status = None
        stopped = False
        metrics = run_dir / "metrics.jsonl"
        while status is None:
            if proc.poll() is not None:
                status = "ok" if proc.returncode == 0 else "failed"
            elif spec.stop_after_rows and len(read_rows(metrics)) >= spec.stop_after_rows:
                _kill_group(proc)
                status, stopped = "ok", True
            elif time.monotonic() - began > limit:
                _kill_group(proc)
                status = "timeout"
            else:
                time.sleep(0.5)
        _kill_group(proc)  # leftovers of a finished run, if any
        log.close()
        text = (self.log_dir / f"run_{spec.name}.log").read_text(errors="replace")
        if status == "failed" and re.search(r"CUDA out of memory|OutOfMemoryError", text):
            status = "oom"
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        schedule_path = run_dir / "schedule.json"
        record = {
            "group": spec.group,
            "status": status,
            "returncode": proc.returncode,
            "stopped_after_metrics": stopped,
            "seconds": round(time.monotonic() - began, 1),
            "cap": spec.cap,
            "overrides": list(spec.overrides),
            "rows": read_rows(metrics),
            "schedule": json.loads(schedule_path.read_text()) if schedule_path.is_file() else None,
            "log_tail": text[-4000:] if status != "ok" else text[-600:],
            "nvidia_smi_peak_mib": poller.peak if poller else None,
        }
        self.records[spec.name] = record
        print(
            f"[gpu_check] {spec.name}: {status} in {record['seconds']} s, "
            f"{len(record['rows'])} rows",
            flush=True,
        )
        return record

    def skip(self, spec: RunSpec, why: str) -> None:
        print(f"[gpu_check] {spec.name}: skipped ({why})", flush=True)
        self.records[spec.name] = {
            "group": spec.group,
            "status": "skipped",
            "cap": spec.cap,
            "overrides": list(spec.overrides),
            "why": why,
            "rows": [],
        }

    def run(self, spec: RunSpec, min_left_s: float = 45) -> dict[str, Any] | None:
        if self.remaining() < min_left_s:
            self.skip(spec, f"{self.remaining():.0f} s left of the budget")
            return None
        with MemoryPoller() as poller:
            proc, run_dir, began, log = self.start(spec)
            return self.finish(spec, proc, run_dir, began, log, poller)


def check(out: Path, budget_s: float, work: Path, only: Sequence[str] = GROUPS) -> int:
    """The whole check (see the module docstring); writes out/gpu_check.json."""
    began = time.monotonic()
    deadline = began + budget_s
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    runner = Runner(work / "runs", work, deadline)
    (work / "runs").mkdir(exist_ok=True)

    from slime_hydra.data.synthetic import SyntheticGRPO
    from slime_hydra.schedule.cost import flops_coefficients

    dims = load_dims(THROUGHPUT_MODEL)
    coefficients = flops_coefficients(dims)
    params = param_count(dims)
    lengths = [int(x) for x in SyntheticGRPO(**THROUGHPUT_DATA).load().total_lengths]
    safe_mbs = largest_safe_micro_batch_size(lengths, THROUGHPUT_CAP, THROUGHPUT_GBS)
    rollout = {
        **THROUGHPUT_DATA,
        "global_batch_size": THROUGHPUT_GBS,
        "samples": len(lengths),
        "tokens": sum(lengths),
        "max_len": max(lengths),
        "mean_len": sum(lengths) / len(lengths),
    }
    print(
        f"[gpu_check] {THROUGHPUT_MODEL}: {params / 1e9:.3f}B parameters; rollout "
        f"{rollout}; safe fixed micro_batch_size at cap {THROUGHPUT_CAP}: {safe_mbs}",
        flush=True,
    )

    # Headline figures first (GROUPS' order). The CPU loss run goes alongside the GPU one.
    if "loss" in only:
        gpu_loss, cpu_loss = loss_runs()
        cpu_started = runner.start(cpu_loss)
        runner.run(gpu_loss)
        runner.finish(cpu_loss, *cpu_started)

    for spec in throughput_runs(safe_mbs):
        if spec.group not in only:
            continue
        why = skip_reason(spec, runner.records)
        if why:
            runner.skip(spec, why)
        else:
            runner.run(spec, min_left_s=60 if spec.group == "throughput" else 50)

    if "fp16" in only:
        runner.run(fp16_run())

    probe = None
    if "probe" in only:
        if runner.remaining() < PROBE_MIN_S:
            probe = {"error": f"skipped: {runner.remaining():.0f} s left of the budget"}
        else:
            probe = run_probe(work, min(150.0, runner.remaining()))
        print(f"[gpu_check] probe: {json.dumps(probe, default=str)[:1500]}", flush=True)

    results = assemble_results(
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        elapsed_s=time.monotonic() - began,
        probe=probe,
        runs=runner.records,
        coefficients=coefficients,
        params=params,
        safe_mbs=safe_mbs,
        rollout=rollout,
    )
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))
    logs = sorted(work.glob("run_*.log"))
    with (out / "runs.log").open("w") as f:
        for path in logs:
            f.write(f"===== {path.name}\n{path.read_text(errors='replace')[-20000:]}\n")
    print(result_table(results), flush=True)
    print(f"[gpu_check] wrote {out / 'gpu_check.json'}", flush=True)
    return 0


def run_probe(work: Path, timeout_s: float) -> dict[str, Any]:
    """`probe` in a child process (this process never touches CUDA); its JSON or the error."""
    path = work / "probe.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "probe", "--json", str(path)]
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return {
            "error": f"probe timed out after {timeout_s:.0f} s",
            "log_tail": str(exc.stdout or "")[-3000:],
        }
    (work / "run_probe.log").write_text(proc.stdout + proc.stderr)
    if path.is_file():
        return json.loads(path.read_text())
    tail = (proc.stdout + proc.stderr)[-3000:]
    return {"error": f"probe exited {proc.returncode}", "log_tail": tail}


# ---------------------------------------------------------------------------------------------
# probe: device, attention and model checks in one CUDA process
# ---------------------------------------------------------------------------------------------


def _section(results: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    """Run one probe section; a failure is recorded with its traceback, the others still run."""
    tic = time.monotonic()
    try:
        results[name] = fn()
    except Exception as exc:  # every failure belongs in the report
        results[name] = {
            "passed": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }
    results[name]["seconds"] = round(time.monotonic() - tic, 2)
    print(f"[probe] {name}: {json.dumps(results[name], default=str)[:800]}", flush=True)


def probe_device() -> dict[str, Any]:
    """Device name, memory, versions, Transformer Engine, and a bf16 matmul rate (random data,
    3 warm-ups, median of 10 timed with CUDA events)."""
    import importlib.metadata as md
    import importlib.util

    import torch

    props = torch.cuda.get_device_properties(0)
    versions = {}
    for dist in (
        "megatron-core",
        "hydra-core",
        "omegaconf",
        "antlr4-python3-runtime",
        "wandb",
        "packaging",
        "numpy",
        "pyyaml",
    ):
        try:
            versions[dist] = md.version(dist)
        except md.PackageNotFoundError:
            versions[dist] = None
    try:
        import wandb  # noqa: F401

        wandb_import = "ok"
    except Exception as exc:
        wandb_import = f"{type(exc).__name__}: {exc}"
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    median = sorted(times)[len(times) // 2]
    del a, b
    torch.cuda.empty_cache()
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "total_memory_gib": round(props.total_memory / 2**30, 2),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "te": importlib.util.find_spec("transformer_engine") is not None,
        "versions": versions,
        "wandb_import": wandb_import,
        "matmul_bf16_tflops": round(2 * n**3 / median / 1e12, 1),
        "passed": True,
    }


def _init_single_rank(device: str) -> dict[str, Any]:
    """One-process group (NCCL on CUDA, gloo for a CPU dry run) and megatron's parallel state,
    as a trainer worker has."""
    import socket

    from slime_hydra.train.run.distributed import init_distributed, seed_everything

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    init_distributed(backend="nccl" if device == "cuda" else "gloo")
    seed_everything(SEED)
    return {"passed": True}


def _thd_params(lengths: Sequence[int], device: str) -> Any:
    """THD params of packed sequences of these lengths, cu_seqlens where the layers want them."""
    from slime_hydra.data.packing import thd_params
    from slime_hydra.train.step.model import seq_params_device

    return thd_params([0, *accumulate(lengths)], seq_params_device(device))


def _rel(x: Any, ref: Any) -> float:
    """‖x − ref‖ / ‖ref‖ in float64."""
    x, ref = x.double(), ref.double()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def attention_check(device: str = "cuda") -> dict[str, Any]:
    """PackedCausalAttention (per-sequence SDPA) on CUDA, THD input, GQA: against a float64
    masked-softmax reference per sequence, and a boundary check: changing one sequence's q, k, v
    must leave every other sequence's output and gradients exactly unchanged."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from slime_hydra.train.step.attention import PackedCausalAttention

    # Lengths around the flash kernels' tile sizes, a 1-token sequence, and a long one (shorter
    # in a CPU dry run, where the float64 reference is slow).
    lengths = [1, 7, 129, 1000, 2048, 37] if device == "cuda" else [1, 7, 129, 300, 257, 37]
    cases = {}
    kernels = {}
    worst_cross = 0.0
    passed = True
    for dtype_name, (heads, groups, dim) in (("bfloat16", (12, 2, 128)), ("float32", (4, 2, 32))):
        dtype = getattr(torch, dtype_name)
        config = TransformerConfig(
            num_layers=1,
            hidden_size=heads * dim,
            num_attention_heads=heads,
            num_query_groups=groups,
            kv_channels=dim,
            params_dtype=dtype,
            bf16=dtype == torch.bfloat16,
            attention_dropout=0.0,
            hidden_dropout=0.0,
        )
        attn = PackedCausalAttention(config, 1, AttnMaskType.causal, "self").to(device)
        total = sum(lengths)
        gen = torch.Generator(device=device).manual_seed(0)

        def draw(
            h: int, total: int = total, dim: int = dim, dtype: Any = dtype, gen: Any = gen
        ) -> Any:
            return torch.randn(total, h, dim, device=device, dtype=dtype, generator=gen)

        q, k, v = draw(heads), draw(groups), draw(groups)
        params = _thd_params(lengths, device)
        out = torch.full((total, heads * dim), float("nan"), device=device, dtype=dtype)
        out.copy_(attn(q, k, v, None, packed_seq_params=params))
        bounds = [0, *accumulate(lengths)]
        errors = []
        for i in range(len(lengths)):
            s = slice(bounds[i], bounds[i + 1])
            qs, ks, vs = (x[s].double().transpose(0, 1) for x in (q, k, v))
            ks = ks.repeat_interleave(heads // groups, dim=0)
            vs = vs.repeat_interleave(heads // groups, dim=0)
            scores = qs @ ks.transpose(1, 2) / math.sqrt(dim)
            mask = torch.ones(lengths[i], lengths[i], dtype=torch.bool, device=device).triu(1)
            ref = (scores.masked_fill(mask, float("-inf")).softmax(-1) @ vs).transpose(0, 1)
            errors.append(_rel(out[s], ref.reshape(lengths[i], -1)))
        finite = bool(torch.isfinite(out).all())
        # Boundary: new values for sequence j; all other outputs must stay bit-identical, and
        # the gradient of sequence a's output must be zero outside sequence a.
        j, a = 3, 4
        sj = slice(bounds[j], bounds[j + 1])
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        q2[sj], k2[sj], v2[sj] = draw(heads)[sj], draw(groups)[sj], draw(groups)[sj]
        out2 = attn(q2, k2, v2, None, packed_seq_params=params)
        outside = torch.ones(total, dtype=torch.bool, device=device)
        outside[sj] = False
        cross = float((out2 - out)[outside].abs().max())
        moved = float((out2 - out)[sj].abs().max())
        qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
        sa = slice(bounds[a], bounds[a + 1])
        y = attn(qg, kg, vg, None, packed_seq_params=params)
        (y[sa].float() * torch.randn_like(y[sa].float())).sum().backward()
        not_a = torch.ones(total, dtype=torch.bool, device=device)
        not_a[sa] = False
        grad_leak = max(float(g.grad[not_a].abs().max()) for g in (qg, kg, vg))
        ok = (
            finite
            and max(errors) <= ATTENTION_RTOL[dtype_name]
            and cross == 0.0
            and moved > 0
            and grad_leak == 0.0
        )
        passed = passed and ok
        worst_cross = max(worst_cross, cross, grad_leak)
        cases[dtype_name] = {
            "heads": heads,
            "query_groups": groups,
            "head_dim": dim,
            "lengths": lengths,
            "max_rel_err": max(errors),
            "rtol": ATTENTION_RTOL[dtype_name],
            "finite": finite,
            "other_sequences_max_abs_change": cross,
            "changed_sequence_max_abs_change": moved,
            "grad_outside_sequence_max_abs": grad_leak,
            "passed": ok,
        }
        # Which SDPA kernels take these shapes (the default dispatch picks the first that does):
        # a packed sequence (causal, GQA), and a CP chunk's masked call (a lower-right causal
        # mask over twice its length) with keys expanded to every head, as the attention makes
        # it, and with GQA kept, as it did before (only the math kernel takes that).
        n = lengths[4]
        qs, ks, vs = (x[:n].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        half = n // 2
        mask = torch.ones(half, n, dtype=torch.bool, device=device).tril(n - half)
        ke, ve = (x.repeat_interleave(heads // groups, dim=1) for x in (ks, vs))
        gqa = heads != groups
        calls = {
            "causal_gqa": (qs, ks, vs, {"is_causal": True, "enable_gqa": gqa}),
            "cp_mask_expanded": (qs[:, :, :half], ke, ve, {"attn_mask": mask}),
            "cp_mask_gqa": (qs[:, :, :half], ks, vs, {"attn_mask": mask, "enable_gqa": gqa}),
        }
        kernels[dtype_name] = {name: {} for name in calls}
        for backend in (
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.CUDNN_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.MATH,
        ):
            for name, (cq, ck, cv, kwargs) in calls.items():
                try:
                    with sdpa_kernel([backend]):
                        F.scaled_dot_product_attention(cq, ck, cv, **kwargs)
                    kernels[dtype_name][name][backend.name] = "ok"
                except Exception as exc:
                    kernels[dtype_name][name][backend.name] = (
                        f"{type(exc).__name__}: {str(exc)[:160]}"
                    )
        if device == "cuda":
            torch.cuda.synchronize()
    return {
        "kernel": "PackedCausalAttention: torch scaled_dot_product_attention once per packed "
        "sequence (causal, enable_gqa), no Transformer Engine",
        "cases": cases,
        "sdpa_backends_accepting": kernels,
        "cross_boundary_max_abs": worst_cross,
        "passed": passed,
    }


def model_parity_check(device: str = "cuda") -> dict[str, Any]:
    """The tiny GPTModel on CUDA (fp32 and bf16) with the CPU model's weights: logits and
    gradients against CPU fp32; packed logits against one sequence at a time; and a changed
    sequence leaves the other sequences' logits unchanged."""
    import torch

    from slime_hydra.train.step.loss import token_log_probs
    from slime_hydra.train.step.model import build_gpt_model, build_model_chunks

    dims = load_dims(TINY)
    lengths = [5, 300, 17, 64]
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, dims.vocab_size, (n,), generator=gen) for n in lengths]
    weights = torch.randn(sum(lengths), generator=gen)

    def forward(model: Any, tokens: list[Any], device: str, grad: bool) -> tuple[Any, Any]:
        ids = torch.cat(tokens).unsqueeze(0).to(device)
        pos = torch.cat([torch.arange(len(t)) for t in tokens]).unsqueeze(0).to(device)
        model.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(grad):
            logits = model(
                ids, pos, None, packed_seq_params=_thd_params([len(t) for t in tokens], device)
            )
            if grad:
                labels = torch.roll(ids, -1, dims=1)
                lp = token_log_probs(logits, labels)
                (lp * weights.to(device)).sum().backward()
        grads = {
            n: p.grad.detach().double().cpu()
            for n, p in model.named_parameters()
            if p.grad is not None
        }
        return logits.detach()[0].double().cpu(), grads

    (cpu_model,) = build_model_chunks(dims, SEED)
    cpu_logits, cpu_grads = forward(cpu_model, seqs, "cpu", True)
    state = cpu_model.state_dict()
    out: dict[str, Any] = {"lengths": lengths, "rtol": PARITY_RTOL, "cases": {}}
    passed = True
    for dtype_name in ("float32", "bfloat16"):
        model = build_gpt_model(dims, device, params_dtype=getattr(torch, dtype_name)).to(device)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        unexpected = [k for k in unexpected if not k.endswith("_extra_state")]
        logits, grads = forward(model, seqs, device, True)
        common = sorted(set(grads) & set(cpu_grads))
        grad_vec = torch.cat([grads[n].flatten() for n in common])
        cpu_vec = torch.cat([cpu_grads[n].flatten() for n in common])
        bounds = [0, *accumulate(lengths)]
        alone = torch.cat([forward(model, [t], device, False)[0] for t in seqs])
        changed = list(seqs)
        changed[1] = torch.randint(0, dims.vocab_size, (lengths[1],), generator=gen)
        logits2, _ = forward(model, changed, device, False)
        keep = torch.ones(bounds[-1], dtype=torch.bool)
        keep[bounds[1] : bounds[2]] = False
        tol = PARITY_RTOL[dtype_name]
        case = {
            "state_dict_missing": missing[:10],
            "state_dict_unexpected": unexpected[:10],
            "logits_rel_err_vs_cpu": _rel(logits, cpu_logits),
            "grad_rel_err_vs_cpu": _rel(grad_vec, cpu_vec),
            "grad_norm_cuda": float(grad_vec.norm()),
            "grad_norm_cpu": float(cpu_vec.norm()),
            "grads_compared": len(common),
            "packed_vs_alone_rel_err": _rel(logits, alone),
            "other_sequences_max_abs_change": float((logits2 - logits)[keep].abs().max()),
            "params_built": sum(p.numel() for p in model.parameters()),
        }
        case["passed"] = (
            not missing
            and not unexpected
            and case["logits_rel_err_vs_cpu"] <= tol
            and case["grad_rel_err_vs_cpu"] <= tol
            and case["packed_vs_alone_rel_err"] <= tol
            and case["other_sequences_max_abs_change"] <= 1e-6 * float(logits.abs().max())
        )
        passed = passed and case["passed"]
        out["cases"][dtype_name] = case
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    out["params_formula_tiny"] = param_count(dims)
    out["params_cpu_model"] = sum(p.numel() for p in cpu_model.parameters())
    out["passed"] = passed and out["params_cpu_model"] == out["params_formula_tiny"]
    return out


def probe(json_path: Path, device: str = "cuda") -> int:
    """Device, attention, model parity and parameter count; JSON at json_path. `device="cpu"`
    is a dry run of the same code on this machine's CPU (no device figures)."""
    from slime_hydra.train.run.distributed import destroy_distributed

    results: dict[str, Any] = {}
    if device == "cuda":
        _section(results, "device", probe_device)
    try:
        _section(results, "setup", lambda: _init_single_rank(device))
        _section(results, "attention", lambda: attention_check(device))
        _section(results, "model_parity", lambda: model_parity_check(device))
    finally:
        destroy_distributed()
    json_path.write_text(json.dumps(results, indent=1, default=str))
    return 0


# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="the whole check, on the device machine")
    p_check.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "outputs/gpu_check")
    )
    p_check.add_argument("--budget-s", type=float, default=400.0)
    p_check.add_argument(
        "--only",
        nargs="+",
        choices=GROUPS,
        default=list(GROUPS),
        help="run only these parts (for a rerun of what failed)",
    )
    p_check.add_argument("--work", type=Path, default=Path("/tmp/gpu_check"))
    p_probe = sub.add_parser("probe", help="device, attention and model checks (child process)")
    p_probe.add_argument("--json", type=Path, required=True)
    p_probe.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a dry run of the probe's code here",
    )
    p_wheels = sub.add_parser("wheels", help="name==version lines to download, from a pip report")
    p_wheels.add_argument("report", type=Path)
    p_wheels.add_argument("--skip", nargs="*", default=[])
    args = parser.parse_args(argv)
    if args.command == "wheels":
        print("\n".join(wheels_to_fetch(json.loads(args.report.read_text()), args.skip)))
        return 0
    if args.command == "probe":
        return probe(args.json, args.device)
    return check(args.out.resolve(), args.budget_s, args.work, tuple(args.only))


if __name__ == "__main__":
    sys.exit(main())
