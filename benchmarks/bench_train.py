"""Training throughput of dynamic vs fixed batching on the same rollouts, trainer=cpu.

Run: .venv/bin/python benchmarks/bench_train.py [--scenario NAME] [--layout NAME] [--calibrate]
Each batching trains the tiny model (4 layers) through the real CLI (2 gloo ranks) on the same
synthetic rollout. Without dynamic batching a user must pick micro_batch_size so that the
longest samples still fit the memory cap: `fixed (safe)` is the largest such size, `fixed (2x)`
doubles it and breaks the cap (it would run out of memory on a GPU sized for the cap). tokens/s
counts real tokens over the summed step times, step 0 (warm-up) excluded.

Two rollouts: the default synthetic lengths (median ~2k tokens) and short answers with a
truncated tail (median ~110 tokens, a few near 4k), where the safe fixed size needs 14x more
micro-batches than dynamic. Three layouts of the 2 ranks:
- tp=2: every micro-batch pays per-layer tensor-parallel all-reduces, a fixed cost per
  micro-batch as on GPUs (there: also kernel launches and pipeline bubbles). Fewer, fuller
  micro-batches win here: dynamic is ahead (docs/training.md: the throughput tables).
- dp=2: no per-micro-batch communication. On 2 CPU cores a micro-batch's fixed cost is a few ms
  and compute per token does not fall with size, so fixed batching is level with dynamic or a
  few percent faster; dynamic still keeps every micro-batch under the cap with the fewest.
- pp=2 vpp=2: megatron's interleaved 1F1B over gloo; every micro-batch crosses the stage
  boundary 2 × vpp times each way (shape exchange, then activations or gradients).

`--calibrate` runs trainer=plan on the same configs and prints the measured step time against
the cost model's `sim/step_s` per layout, with the TFLOP/s that would make them agree: the cost
model is right up to one constant when that figure is the same for every layout.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from slime_hydra.data.synthetic import SyntheticGRPO

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {
    "tp=2": {"dp": 1, "tp": 2},
    "dp=2": {"dp": 2, "tp": 1},
    "pp=2 vpp=2": {"dp": 1, "pp": 2, "vpp": 2, "microbatch_group_size_per_vp_stage": 2},
}
MODEL = ["model.num_layers=4"]
"""Four layers, so that pp=2 × vpp=2 has one per model chunk; the same model on every layout."""
SCENARIOS = {
    "default lengths": {"num_prompts": 16},
    "short answers, long tail": {
        "num_prompts": 64,
        "prompt_len_median": 48,
        "max_prompt_len": 96,
        "response_len_median": 32,
        "difficulty_sigma": 1.2,
        "sample_sigma": 1.0,
        "max_response_len": 4000,
    },
}


def train(run_dir: Path, overrides: list[str]) -> list[dict]:
    """Run the CLI with these overrides; return its metrics.jsonl rows."""
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run([*cmd, *overrides], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(overrides)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def safe_micro_batch_size(max_len: int, cap: int, per_rank: int) -> int:
    """The largest micro_batch_size dividing the rank's samples with mbs × max_len ≤ cap."""
    return max(m for m in range(1, per_rank + 1) if per_rank % m == 0 and m * max_len <= cap)


def mean(rows: list[dict], key: str) -> float:
    """The mean of one metric over the rows."""
    return sum(r[key] for r in rows) / len(rows)


def scenario(name: str, data: dict, layout: str, global_batch_size: int, cap: int) -> None:
    """Train dynamic, safe fixed and 2x fixed on one rollout and layout; print a table."""
    sizes = LAYOUTS[layout]
    max_len = int(SyntheticGRPO(**data).load().total_lengths.max())
    mbs = safe_micro_batch_size(max_len, cap, global_batch_size // sizes["dp"])
    common = [
        "logger=jsonl",
        *MODEL,
        *(f"parallel.{key}={value}" for key, value in sizes.items()),
        f"batching.global_batch_size={global_batch_size}",
        f"batching.max_tokens_per_gpu={cap}",
        *(f"data.{key}={value}" for key, value in data.items()),
    ]
    runs = {
        "dynamic": ["batching=dynamic"],
        f"fixed mbs={mbs} (safe)": ["batching=fixed", f"batching.micro_batch_size={mbs}"],
        f"fixed mbs={2 * mbs} (2x)": ["batching=fixed", f"batching.micro_batch_size={2 * mbs}"],
    }
    print(f"\n{name}, {layout}: longest sample {max_len} tokens, cap {cap} tokens per micro-batch")
    widths = (22, 8, 7, 9, 8, 8, 6)
    header = ("batching", "mbs/rank", "tok_imb", "over cap", "train s", "tok/s", "vs dyn")
    cells = [f"{h:>{w}}" for h, w in zip(header, widths, strict=True)]
    print(f"{header[0]:<{widths[0]}}", *cells[1:])
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, overrides) in enumerate(runs.items()):
            rows = train(Path(tmp) / str(i), [*common, *overrides])[1:]
            seconds = sum(r["perf/step_s"] for r in rows)
            throughput = sum(r["perf/tokens_per_s"] * r["perf/step_s"] for r in rows) / seconds
            base = base or throughput
            print(
                f"{label:<22} {mean(rows, 'batch/num_microbatches'):>8.1f} "
                f"{mean(rows, 'batch/token_imbalance'):>7.2f} "
                f"{sum(r['batch/cap_violations'] for r in rows):>9} "
                f"{seconds:>8.1f} {throughput:>8.0f} {throughput / base:>6.2f}",
                flush=True,
            )


def calibrate(data: dict, global_batch_size: int, cap: int) -> None:
    """Measured step time against trainer=plan's sim/step_s, dynamic batching, every layout."""
    default_tflops = 400.0  # trainer=plan's achieved_tflops default (conf/trainer/plan.yaml)
    print(f"\ncost model calibration, dynamic batching, cap {cap}:")
    print(f"{'layout':<12} {'measured s':>10} {'sim s':>9} {'ratio':>7} {'fit TFLOP/s':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (layout, sizes) in enumerate(LAYOUTS.items()):
            common = [
                "logger=jsonl",
                *MODEL,
                *(f"parallel.{key}={value}" for key, value in sizes.items()),
                f"batching.global_batch_size={global_batch_size}",
                f"batching.max_tokens_per_gpu={cap}",
                *(f"data.{key}={value}" for key, value in data.items()),
            ]
            measured = train(Path(tmp) / f"train{i}", common)[1:]
            simulated = train(Path(tmp) / f"plan{i}", [*common, "trainer=plan"])[1:]
            real, sim = mean(measured, "perf/step_s"), mean(simulated, "sim/step_s")
            print(
                f"{layout:<12} {real:>10.2f} {sim:>9.4f} {real / sim:>7.0f} "
                f"{default_tflops * sim / real:>11.4f}",
                flush=True,
            )


def main() -> None:
    """Run every scenario (or the one named), or the calibration."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default=None)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default=None)
    parser.add_argument("--global-batch-size", type=int, default=None, help="default: 1/4 rollout")
    parser.add_argument("--max-tokens-per-gpu", type=int, default=8192)
    parser.add_argument("--calibrate", action="store_true", help="cost model vs measured steps")
    args = parser.parse_args()
    if args.calibrate:
        name = args.scenario or "short answers, long tail"
        data = SCENARIOS[name]
        samples = data["num_prompts"] * SyntheticGRPO().n_samples_per_prompt
        calibrate(data, args.global_batch_size or samples // 4, args.max_tokens_per_gpu)
        return
    for layout in LAYOUTS:
        for name, data in SCENARIOS.items():
            if args.scenario in (None, name) and args.layout in (None, layout):
                samples = data["num_prompts"] * SyntheticGRPO().n_samples_per_prompt
                gbs = args.global_batch_size or samples // 4
                scenario(name, data, layout, gbs, args.max_tokens_per_gpu)


if __name__ == "__main__":
    main()
