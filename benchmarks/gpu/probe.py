"""probe: device, attention and model checks in one CUDA process (`--device cpu`: a dry run of
the same code here)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any

from .figures import load_dims, param_count
from .settings import ATTENTION_RTOL, PARITY_RTOL, SEED, TINY


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
