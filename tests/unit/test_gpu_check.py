"""The CPU-checkable parts of benchmarks/gpu_check.py (the H200 check), against values computed
by hand: parameter counts, FLOPs and MFU, the safe fixed micro-batch size, command lines, the
loss comparison, the memory fit, the result JSON and the list of wheels to carry."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.gpu.figures import (
    calibration_summary,
    compare_losses,
    fp16_summary,
    largest_safe_micro_batch_size,
    load_dims,
    memory_at,
    memory_fit,
    mfu,
    param_count,
    sequence_flops,
    step_flops,
    summarize_run,
    tokens_that_fit,
)
from benchmarks.gpu.results import assemble_results, result_table
from benchmarks.gpu.runner import read_rows
from benchmarks.gpu.runs import (
    calibration_runs,
    cli_command,
    fp16_run,
    loss_runs,
    skip_reason,
    throughput_runs,
)
from benchmarks.gpu.settings import (
    CARD_GIB,
    LOSS_DATA,
    SEED,
    THROUGHPUT_CAP,
    THROUGHPUT_DATA,
    THROUGHPUT_GBS,
    THROUGHPUT_MODEL,
)
from benchmarks.gpu.wheels import normalize, wheels_to_fetch
from slime_hydra.schedule.cost import ModelDims, flops_coefficients

REPO = Path(__file__).resolve().parents[2]


def dims(**overrides) -> ModelDims:
    base = dict(
        name="t",
        num_layers=2,
        hidden_size=128,
        ffn_hidden_size=512,
        num_attention_heads=4,
        num_query_groups=2,
        vocab_size=256,
        max_position_embeddings=4096,
        add_qkv_bias=True,
        untie_embeddings_and_output_weights=True,
    )
    return ModelDims(**{**base, **overrides})


# --- parameter count -------------------------------------------------------------------------


def test_param_count_tiny_by_hand():
    # h=128, n=4, g=2, d=32, f=512, V=256 (already a multiple of 128), untied, QKV bias.
    # Per layer: QKV 128·(128+128) = 32768, its bias 256, proj 128·128 = 16384,
    # fc1 2·512·128 = 131072, fc2 512·128 = 65536, two RMSNorms 2·128 = 256 → 246272.
    # Embedding 256·128 = 32768, output layer 32768, final norm 128.
    expected = 32768 + 32768 + 2 * 246272 + 128
    assert expected == 558208
    assert param_count(load_dims("tiny")) == expected
    assert param_count(dims()) == expected


def test_param_count_qwen2_5_1_5b_by_hand():
    # Qwen2.5-1.5B: h=1536, 28 layers, n=12, g=2, d=128, f=8960, V=151936 (= 1187·128), tied.
    # Per layer: QKV 1536·2048 = 3145728 + bias 2048, proj 1536·1536 = 2359296,
    # fc1 17920·1536 = 27525120, fc2 8960·1536 = 13762560, norms 3072 → 46797824.
    per_layer = 3145728 + 2048 + 2359296 + 27525120 + 13762560 + 3072
    assert per_layer == 46797824
    expected = 151936 * 1536 + 28 * per_layer + 1536
    assert expected == 1_543_714_304  # HF's model card: 1.54B, 1.31B without embeddings
    d = load_dims(THROUGHPUT_MODEL)
    assert param_count(d) == expected
    assert param_count(d) - 151936 * 1536 == pytest.approx(1.31e9, rel=0.001)


def test_param_count_pads_vocab_and_counts_layernorm_and_bias_options():
    # V=300 pads to 384 (128 × tp=1) and to 512 with tp=2 (multiple of 256).
    plain = dims(vocab_size=300, add_qkv_bias=False, untie_embeddings_and_output_weights=False)
    layer = 128 * 256 + 16384 + 131072 + 65536 + 256
    assert param_count(plain) == 384 * 128 + 2 * layer + 128
    assert param_count(plain, tp=2) == 512 * 128 + 2 * layer + 128
    # LayerNorm has a bias too: 2h per norm; GELU MLP (no SwiGLU): fc1 is f·h.
    ln = dims(normalization="LayerNorm", swiglu=False, add_qkv_bias=False)
    layer = 128 * 256 + 16384 + 512 * 128 + 512 * 128 + 2 * 256
    assert param_count(ln) == 2 * 256 * 128 + 2 * layer + 256


# --- FLOPs and MFU ---------------------------------------------------------------------------


def test_sequence_flops_and_mfu_by_hand():
    coefficients = (10, 2)
    # 10·3 + 2·9 = 48 and 10·5 + 2·25 = 100.
    assert sequence_flops([3, 5], coefficients) == 148
    assert mfu(990e12, 2.0) == pytest.approx(0.5)
    assert mfu(4e12, 1.0, peak=1e12, gpus=8) == pytest.approx(0.5)


def test_qwen2_5_1_5b_flops_per_token():
    a, b = flops_coefficients(load_dims(THROUGHPUT_MODEL))
    # Dense: 6·(28·(1536·(3072+512) + 3·1536·8960) + 1536·151936) = 9261416448; b = 6·28·12·128.
    assert b == 258048
    assert a == 9261416448 + b
    # A 2048-token sample: about 19.5 TFLOP for forward and backward.
    assert sequence_flops([2048], (a, b)) == a * 2048 + b * 2048**2


def schedule_doc():
    # Lengths 100, 200, 300, 400; step 1 = samples 0,1 (one rank, two micro-batches),
    # step 2 = samples 2,3 (two ranks).
    return {
        "lengths": [100, 200, 300, 400],
        "cap": 1000,
        "steps": [
            {"step": 1, "num_microbatches": 2, "ranks": [[[0], [1]]]},
            {"step": 2, "num_microbatches": 1, "ranks": [[[2]], [[3]]]},
        ],
    }


def test_step_flops_reads_every_rank_and_micro_batch():
    doc = schedule_doc()
    assert step_flops(doc, 1, (1, 0)) == 300
    assert step_flops(doc, 2, (1, 1)) == 300 + 300**2 + 400 + 400**2


def rows():
    # Step 1 is the warm-up; steps 2 and 3 take 2 s and 6 s for 700 tokens each.
    return [
        {
            "step": 1,
            "perf/step_s": 10.0,
            "perf/tokens_per_s": 30.0,
            "batch/num_microbatches": 2,
            "batch/mb_tokens_max": 200,
            "batch/cap_violations": 0,
            "train/loss": 0.5,
            "perf/max_memory_gib": 10.0,
        },
        {
            "step": 2,
            "perf/step_s": 2.0,
            "perf/tokens_per_s": 350.0,
            "batch/num_microbatches": 1,
            "batch/mb_tokens_max": 400,
            "batch/cap_violations": 1,
            "train/loss": 0.4,
            "perf/max_memory_gib": 12.5,
            "perf/max_memory_reserved_gib": 14.0,
        },
        {
            "step": 3,
            "perf/step_s": 6.0,
            "perf/tokens_per_s": 700 / 6,
            "batch/num_microbatches": 3,
            "batch/mb_tokens_max": 300,
            "batch/cap_violations": 0,
            "train/loss": 0.3,
            "perf/max_memory_gib": 11.0,
        },
    ]


def test_summarize_run_by_hand():
    doc = schedule_doc()
    doc["steps"].append({"step": 3, "num_microbatches": 1, "ranks": [[[2, 3]]]})
    out = summarize_run(rows(), doc, (1e12, 0), peaks={"p": 100e12})
    assert out["timed_steps"] == [2, 3]
    assert out["step_s"] == pytest.approx(4.0)
    assert out["tokens_per_s"] == pytest.approx(1400 / 8)
    assert out["num_microbatches"] == pytest.approx(2.0)
    # Memory is step 2's (Adam's moments exist), not the largest of all steps.
    assert out["memory"] == {
        "step": 2,
        "allocated_gib": 12.5,
        "reserved_gib": 14.0,
        "mb_tokens_max": 400,
    }
    assert out["mb_tokens_max"] == 400
    assert out["cap_violations"] == 1
    # FLOPs 1e12 per token: steps 2 and 3 hold 700 tokens each → 1.4e15 in 8 s.
    assert out["model_tflops_per_s"] == pytest.approx(175.0)
    assert out["mfu"]["p"] == pytest.approx(1.75)
    assert out["loss"] == [0.5, 0.4, 0.3]


def test_summarize_run_single_step_and_missing_memory():
    one = [{k: v for k, v in rows()[0].items() if k != "perf/max_memory_gib"}]
    out = summarize_run(one, None, (1, 0))
    assert out["timed_steps"] == [1]
    assert out["tokens_per_s"] == pytest.approx(30.0)
    assert out["memory"] is None  # no step 2
    assert "mfu" not in out


def test_memory_is_read_at_step_2_only():
    first = [{**rows()[0], "perf/max_memory_gib": 99.0}]
    assert memory_at(first) is None  # step 1: before Adam's moments exist
    assert memory_at(rows())["allocated_gib"] == 12.5
    no_gpu = [{k: v for k, v in r.items() if not k.startswith("perf/max_memory")} for r in rows()]
    assert memory_at(no_gpu) is None


# --- the safe fixed micro-batch size ---------------------------------------------------------


def test_largest_safe_micro_batch_size():
    lengths = [100, 4096, 300, 4000, 50, 3000, 10, 10]
    # The two longest: 4096 + 4000 = 8096 ≤ 8192, three: 11096 > 8192 → 2 (divides 64).
    assert largest_safe_micro_batch_size(lengths, 8192, 64) == 2
    # Three longest fill a cap of 150 exactly, and 3 divides 6 samples per rank.
    short = [10, 20, 30, 40, 50, 60]
    assert largest_safe_micro_batch_size(short, 150, 6) == 3  # 60+50+40 = 150
    # 4 longest fit (60+50+40+30 = 180 ≤ 190) but 4 does not divide 6: 3 it is.
    assert largest_safe_micro_batch_size(short, 190, 6) == 3
    assert largest_safe_micro_batch_size(short, 10_000, 6) == 6
    with pytest.raises(ValueError, match="over the cap"):
        largest_safe_micro_batch_size(lengths, 4000, 64)


def test_safe_micro_batch_size_of_the_throughput_rollout():
    from slime_hydra.data.synthetic import SyntheticGRPO

    lengths = [int(n) for n in SyntheticGRPO(**THROUGHPUT_DATA).load().total_lengths]
    assert len(lengths) == 256
    # Several samples hit the 1024 + 3072 ceiling, so two longest fill the 8192 cap exactly.
    assert max(lengths) == 4096
    assert largest_safe_micro_batch_size(lengths, THROUGHPUT_CAP, THROUGHPUT_GBS) == 2


# --- commands ---------------------------------------------------------------------------------


def test_cli_command():
    assert cli_command("py", Path("/r/x"), replace(fp16_run(), overrides=("a=1", "b=2"))) == [
        "py",
        "-m",
        "slime_hydra",
        "hydra.run.dir=/r/x",
        "a=1",
        "b=2",
    ]


def test_the_calibration_writes_its_file_and_the_run_after_it_loads_it():
    calibrate, calibrated = calibration_runs(Path("/w/runs"), cap=4096, steps=3)
    assert cli_command("py", Path("/w/runs/calibration"), calibrate) == [
        "py",
        "-m",
        "slime_hydra.calibrate",
        "--out",
        "/w/runs/calibration/calibration.json",
        "--repeats",
        "1",
        "--max-tokens",
        "4096",
        "--min-tokens",
        "512",
        "trainer=gpu",
        "logger=jsonl",
        "parallel.dp=1",
        "model=qwen2_5_1_5b",
        "seed=1234",
    ]
    assert calibrated.overrides[-1] == "trainer.cost=/w/runs/calibration/calibration.json"
    assert list(calibrated.overrides[:-1]) == list(
        throughput_runs(2, cap=4096, steps=3)[0].overrides
    )
    assert (calibrated.group, calibrated.stop_after_rows) == ("calibration", 3)


def test_loss_runs_differ_only_in_trainer_and_dtype():
    gpu, cpu = loss_runs()
    assert gpu.overrides[0] == "trainer=gpu" and cpu.overrides[0] == "trainer=cpu"
    assert gpu.overrides[1:-1] == cpu.overrides[1:]
    assert gpu.overrides[-1] == "trainer.params_dtype=float32"
    for needed in (
        "parallel.dp=1",
        "model=tiny",
        "seed=1234",
        "trainer.lr=0.0001",  # the trainers' default lr differ (1e-3 CPU, 1e-6 GPU)
        "trainer.max_steps=2",
        "logger=jsonl",
        "data.num_prompts=8",
        "batching.global_batch_size=32",
    ):
        assert needed in cpu.overrides
    assert gpu.stop_after_rows is None  # the tiny runs finish and checkpoint on CUDA


def test_loss_runs_train_the_model_on_rollout_log_probs(compose_cfg):
    """The loss depends on the model only if the ratio is not 1: the lengths-only rollout gets
    synthesized tokens, which carry the noise model's log-probs (data.rollout.with_tokens)."""
    from slime_hydra.data.rollout import with_tokens
    from slime_hydra.data.synthetic import SyntheticGRPO

    rollout = SyntheticGRPO(**LOSS_DATA).load()
    assert rollout.tokens is None
    tokens = with_tokens(rollout, load_dims("tiny").vocab_size, SEED).tokens
    assert tokens.old_logprobs is not None and (tokens.old_logprobs < 0).all()


def test_throughput_runs():
    runs = throughput_runs(2, cap=8192, memory_caps=(32768, 4096), steps=4)
    assert [r.name for r in runs] == [
        "dynamic_cap8192",
        "fixed_mbs2_cap8192",
        "dynamic_cap32768",
        "dynamic_cap4096",
    ]
    dyn, fixed, mem = runs[0], runs[1], runs[2]
    common = [
        "trainer=gpu",
        "logger=jsonl",
        "parallel.dp=1",
        "model=qwen2_5_1_5b",
        "seed=1234",
        "data=synthetic_grpo",
        "data.num_prompts=32",
        "data.n_samples_per_prompt=8",
        "batching.global_batch_size=64",
    ]
    assert list(dyn.overrides) == [
        *common,
        "batching=dynamic",
        "batching.max_tokens_per_gpu=8192",
        "trainer.max_steps=4",
    ]
    assert list(fixed.overrides) == [
        *common,
        "batching=fixed",
        "batching.micro_batch_size=2",
        "batching.max_tokens_per_gpu=8192",
        "trainer.max_steps=4",
    ]
    assert (dyn.stop_after_rows, fixed.stop_after_rows, mem.stop_after_rows) == (4, 4, 2)
    assert mem.group == "memory" and mem.cap == 32768
    assert "batching.max_tokens_per_gpu=32768" in mem.overrides
    assert "trainer.max_steps=2" in mem.overrides  # memory is read at step 2


def test_overrides_compose(compose_cfg):
    """Every override the check passes is one the app accepts (composition, not a run)."""
    for spec in [*loss_runs(), *throughput_runs(2), *calibration_runs(Path("/w"))]:
        cfg = compose_cfg(*spec.overrides)
        assert cfg.parallel.dp == 1
    cfg = compose_cfg(*throughput_runs(2)[1].overrides)
    assert cfg.batching.micro_batch_size == 2 and cfg.model.name == "qwen2_5_1_5b"


def test_skip_reason():
    spec = throughput_runs(2, memory_caps=(16384,))[2]
    assert skip_reason(spec, {}) is None
    ok = {"group": "throughput", "status": "ok", "cap": 8192}
    assert skip_reason(spec, {"a": ok}) is None
    assert "failed" in skip_reason(spec, {"a": {**ok, "status": "failed"}})
    assert "out of memory" in skip_reason(
        spec, {"m": {"group": "memory", "status": "oom", "cap": 8192}}
    )
    # A larger cap running out of memory says nothing about a smaller one.
    assert skip_reason(spec, {"m": {"group": "memory", "status": "oom", "cap": 32768}}) is None
    # Throughput runs always start (budget permitting); loss-run failures do not count.
    assert skip_reason(throughput_runs(2)[1], {"a": {**ok, "status": "failed"}}) is None
    assert skip_reason(spec, {"l": {"group": "loss", "status": "failed"}}) is None


# --- loss comparison, memory fit, result JSON -------------------------------------------------


def test_compare_losses():
    gpu = [
        {"step": 1, "train/loss": 0.3, "train/grad_norm": 1.0},
        {"step": 2, "train/loss": 0.2000001, "train/grad_norm": 2.0},
    ]
    cpu = [
        {"step": 1, "train/loss": 0.3, "train/grad_norm": 1.00005},
        {"step": 2, "train/loss": 0.2, "train/grad_norm": 2.0},
    ]
    out = compare_losses(gpu, cpu)
    assert out["passed"]
    assert out["steps"][1]["loss_rel_diff"] == pytest.approx(5e-7)
    assert out["steps"][0]["grad_norm_rel_diff"] == pytest.approx(5e-5 / 1.00005)
    # A planted difference fails the check: a grad norm 1e-3 off at step 2, a loss 3% off.
    planted = [gpu[0], {**gpu[1], "train/grad_norm": 2.002}]
    out = compare_losses(planted, cpu)
    assert not out["passed"] and not out["steps"][1]["grad_norm_ok"] and out["steps"][1]["loss_ok"]
    assert not compare_losses(gpu, [{**cpu[0], "train/loss": 0.309}, cpu[1]])["passed"]
    assert not compare_losses(gpu, cpu[:1])["passed"]  # step 2 missing
    nan = [{"step": 1, "train/loss": float("nan"), "train/grad_norm": 1.0}, gpu[1]]
    assert not compare_losses(nan, cpu)["passed"]
    assert not compare_losses([], [])["passed"]


def test_fp16_summary_by_hand():
    def row(step, skipped, scale, loss=0.5):
        return {"step": step, "train/skipped_steps": skipped, "train/loss_scale": scale,
                "train/loss": loss}  # fmt: skip

    # Steps 1-3 overflow (the count grows), step 4 applies at 2**30, step 5 overflows again.
    rows_ = [row(1, 1, 2.0**32), row(2, 2, 2.0**32), row(3, 3, 2.0**31), row(4, 3, 2.0**30),
             row(5, 4, 2.0**30)]  # fmt: skip
    out = fp16_summary(rows_)
    assert (out["first_applied_step"], out["applied_steps"], out["skipped_steps"]) == (4, 1, 4)
    assert out["passed"] and out["loss_scales"][3] == 2.0**30
    never = [row(s, s, 2.0 ** (33 - s)) for s in range(1, 6)]  # the scale stuck, every skip
    assert not fp16_summary(never)["passed"]
    assert not fp16_summary([*rows_[:4], row(5, 3, 2.0**30, float("nan"))])["passed"]
    assert not fp16_summary([])["passed"]


def test_fp16_run_trains_the_tiny_model_in_float16(compose_cfg):
    spec = fp16_run()
    cfg = compose_cfg(*spec.overrides)
    assert cfg.trainer.params_dtype == "float16" and cfg.model.name == "tiny"
    assert cfg.trainer.max_steps == 30 and cfg.batching.global_batch_size == 2
    assert cfg.data.num_prompts * cfg.data.n_samples_per_prompt >= 30 * 2  # 30 whole steps


def test_memory_fit():
    fit = memory_fit([(4000, 40.0), (8000, 50.0), (16000, 70.0)])
    assert fit["gib_per_1k_tokens"] == pytest.approx(2.5)
    assert fit["base_gib"] == pytest.approx(30.0)
    assert tokens_that_fit(fit, 130.0) == 40000
    assert memory_fit([(8000, 50.0)]) is None
    assert memory_fit([(8000, 50.0), (8000, 51.0)]) is None


def run_record(group, cap, status="ok", rows_=None, schedule=None):
    return {
        "group": group,
        "status": status,
        "cap": cap,
        "rows": rows_ or [],
        "schedule": schedule,
        "overrides": [],
    }


def test_assemble_results():
    doc = schedule_doc()
    doc["steps"].append({"step": 3, "num_microbatches": 1, "ranks": [[[2, 3]]]})
    loss_rows = [
        {"step": 1, "train/loss": 0.3, "train/grad_norm": 1.0},
        {"step": 2, "train/loss": 0.2, "train/grad_norm": 0.9},
    ]
    slow = [
        {**r, "perf/tokens_per_s": r["perf/tokens_per_s"] / 2, "perf/step_s": r["perf/step_s"] * 2}
        for r in rows()
    ]
    runs = {
        "loss_gpu_fp32": run_record("loss", None, rows_=loss_rows),
        "loss_cpu_fp32": run_record("loss", None, rows_=loss_rows),
        "dynamic_cap8192": run_record("throughput", 8192, rows_=rows(), schedule=doc),
        "fixed_mbs2_cap8192": run_record("throughput", 8192, rows_=slow, schedule=doc),
        "dynamic_cap32768": run_record("memory", 32768, status="oom"),
        "dynamic_cap4096": run_record(
            "memory",
            4096,
            rows_=[
                rows()[0],
                {**rows()[1], "batch/mb_tokens_max": 100, "perf/max_memory_gib": 9.0},
            ],
        ),
    }
    probe = {
        "device": {"name": "NVIDIA H200", "matmul_bf16_tflops": 800.0, "total_memory_gib": 139.8}
    }
    out = assemble_results(
        date="2026-12-01",
        elapsed_s=300.04,
        probe=probe,
        runs=runs,
        coefficients=(1e12, 0),
        params=123,
        safe_mbs=2,
        rollout={"samples": 4},
    )
    json.dumps(out)  # serialisable as it is
    assert out["elapsed_s"] == 300.0
    assert out["peaks_flops"] == {"h200_dense_bf16_990": 990e12, "measured_matmul_bf16": 800e12}
    assert out["loss_check"]["passed"]
    dyn = out["throughput"]["runs"]["dynamic_cap8192"]
    assert dyn["mfu"]["h200_dense_bf16_990"] == pytest.approx(175e12 / 990e12)
    assert dyn["mfu"]["measured_matmul_bf16"] == pytest.approx(175 / 800)
    assert out["throughput"]["dynamic_over_fixed"] == pytest.approx(2.0)
    assert out["throughput"]["safe_micro_batch_size"] == 2
    mem = out["memory"]["runs"]
    assert [m["max_tokens_per_gpu"] for m in mem] == [4096, 8192, 8192, 32768]
    assert mem[-1]["status"] == "oom" and mem[-1]["allocated_gib"] is None
    assert mem[0]["step"] == 2 and mem[0]["reserved_gib"] == 14.0
    # Dynamic points at step 2: (100 tokens, 9 GiB) and (400, 12.5): 3.5 GiB per 300 tokens.
    assert out["memory"]["fit"]["gib_per_1k_tokens"] == pytest.approx(3.5 / 0.3)
    assert out["memory"]["card_gib"] == 139.8
    assert out["memory"]["tokens_fitting_card"] > 400
    assert "schedule" not in out["runs"]["dynamic_cap8192"]
    table = result_table(out)
    assert "dynamic_cap8192" in table and "oom" in table


def test_assemble_results_without_probe_or_runs():
    out = assemble_results(
        date="d",
        elapsed_s=1,
        probe=None,
        runs={},
        coefficients=(1, 0),
        params=1,
        safe_mbs=1,
        rollout={},
    )
    assert out["loss_check"] is None and out["memory"]["fit"] is None
    assert out["peaks_flops"] == {"h200_dense_bf16_990": 990e12}
    assert out["memory"]["card_gib"] == CARD_GIB
    result_table(out)


def test_calibration_summary_by_hand():
    calibration = {
        "device": "NVIDIA H200",
        "terms": {"token_s": 1e-6},
        "stderr": {"token_s": 1e-8},
        "samples": [
            {"step_s": 1.1, "predicted_step_s": 1.0},
            {"step_s": 0.9, "predicted_step_s": 1.0},
            {"step_s": 2.0, "predicted_step_s": 1.6},
        ],
    }
    # The first row is the warm-up; 1.10 and 1.20 are timed: median 1.15, one beyond ±15%.
    run = {
        "status": "ok",
        "rows": [{"perf/sim_ratio": 3.0}, {"perf/sim_ratio": 1.1}, {"perf/sim_ratio": 1.2}],
    }
    out = calibration_summary(calibration, run)
    assert out["grid_meas_over_pred_median"] == pytest.approx(1.1)
    assert out["run_meas_over_sim"] == [1.1, 1.2]
    assert out["run_meas_over_sim_median"] == pytest.approx(1.15)
    assert out["within_15pct"] is False
    assert out["terms"] == {"token_s": 1e-6} and out["run_status"] == "ok"
    missed = calibration_summary(calibration, None)
    assert missed["run_meas_over_sim_median"] is None and missed["within_15pct"] is None
    table = result_table(
        {"date": "d", "elapsed_s": 1, "calibration": calibration_summary(calibration, run)}
    )
    assert "calibrated run meas/sim 1.150 (within ±15%: False)" in table


def test_read_rows_skips_a_half_written_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"st')
    assert read_rows(path) == [{"step": 0}, {"step": 1}]
    assert read_rows(tmp_path / "none.jsonl") == []


# --- wheels -----------------------------------------------------------------------------------


def test_wheels_to_fetch():
    def item(name, version):
        return {"metadata": {"name": name, "version": version}}

    report = {
        "install": [
            item("wandb", "0.31.0"),
            item("PyYAML", "6.0.4"),
            item("typing_extensions", "4.16.0"),
            item("pydantic_core", "2.50.5"),
            item("torch", "2.13.0"),
            item("nvidia-nccl-cu12", "2"),
            item("antlr4-python3-runtime", "4.9.3"),
            item("Hydra_Core", "1.3.8"),
        ]
    }
    assert wheels_to_fetch(report, skip=["antlr4_python3_runtime"]) == [
        "hydra-core==1.3.8",
        "pydantic-core==2.50.5",
        "wandb==0.31.0",
    ]


def test_normalize():
    assert normalize("PyYAML") == "pyyaml"
    assert normalize("typing_extensions") == "typing-extensions"
    assert normalize("zope.interface") == "zope-interface"


# --- the probe's code, dry run on CPU ---------------------------------------------------------


@pytest.mark.integration
def test_probe_dry_run_on_cpu(tmp_path):
    """`gpu_check.py probe --device cpu`: the attention boundary and model parity code of the
    device check runs here against the current slime_hydra (CPU against CPU, so only the code
    paths and the tiny model's parameter count are checked, not CUDA numerics)."""
    import subprocess

    out = tmp_path / "probe.json"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks/gpu_check.py"),
        "probe",
        "--device",
        "cpu",
        "--json",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    failed = {k: v.get("error") for k, v in result.items() if not v.get("passed")}
    assert not failed, failed
    attention = result["attention"]["cases"]
    assert attention["bfloat16"]["other_sequences_max_abs_change"] == 0.0
    assert attention["float32"]["grad_outside_sequence_max_abs"] == 0.0
    assert result["model_parity"]["params_cpu_model"] == 558208


@pytest.mark.integration
def test_check_script_uses_importable_packages_without_wheels(tmp_path):
    """gpu_check.sh with no carried wheels on a machine that has the packages (this one):
    neither installs nor reaches a registry, and `check` writes its JSON (no part has time)."""
    import os
    import subprocess

    env = {
        **os.environ,
        "GPU_WHEELS": str(tmp_path / "no_wheels"),
        "OUT": str(tmp_path / "out"),
        "PYTHON": sys.executable,
    }
    cmd = ["bash", str(REPO / "benchmarks/gpu_check.sh"), "--only", "probe", "--budget-s", "1"]
    cmd += ["--work", str(tmp_path / "work")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "importable: using them" in proc.stdout
    assert "pip install" not in proc.stdout
    results = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert results["probe_error"].startswith("skipped")
