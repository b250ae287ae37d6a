"""Training throughput of dynamic vs fixed batching on the same rollouts, trainer=cpu.

Run: .venv/bin/python benchmarks/bench_train.py [--scenario NAME] [--layout NAME] [--repeats N]
     [--calibrate | --cost FILE]
Each batching trains the tiny model (4 layers) through the real CLI (2 gloo ranks) on the same
synthetic rollout: dynamic with the fewest micro-batches (the baseline every ratio is against),
batching.count=fastest (the count and order the step cost model simulates fastest), and every
fixed micro_batch_size that keeps the cap (without dynamic batching a user must pick one so that
the longest samples still fit). Each runs `--repeats` times (at least 3), the batchings in
alternating order (forwards, then backwards, ...), so drift on a shared machine spreads over all
of them; the table shows the median of the training seconds (steps after the first, the warm-up)
and its spread (min–max over the repeats).

Compute against bubble: `sim bub` is the simulated idle share of the pipeline stages
(sim/bubble_frac, from the cost model), `meas/sim` the measured over the predicted step time
(perf/sim_ratio, median over steps and repeats); `gap s` is measured minus predicted seconds,
what the model does not explain. The prediction is the analytic model (uncalibrated) unless
`--calibrate` (run python -m slime_hydra.calibrate for the layout first, on the same model) or
`--cost FILE` gives a calibration: then `fastest` chooses with it too.

Two rollouts: the default synthetic lengths (median ~2k tokens) and short answers with a
truncated tail (median ~110 tokens, a few near 4k), where the safe fixed size needs 14x more
micro-batches than dynamic. Four layouts of the 2 ranks:
- tp=2: every micro-batch pays per-layer tensor-parallel all-reduces, a fixed cost per
  micro-batch as on GPUs (there: also kernel launches and pipeline bubbles). Fewer, fuller
  micro-batches win here: dynamic is ahead (docs/training.md: the throughput tables).
- dp=2: no per-micro-batch communication. On 2 CPU cores a micro-batch's fixed cost is a few ms
  and compute per token does not fall with size, so fixed batching is level with dynamic or a
  few percent faster; dynamic still keeps every micro-batch under the cap with the fewest.
- pp=2 vpp=2: megatron's interleaved 1F1B over gloo; every micro-batch crosses the stage
  boundary 2 × vpp times each way (shape exchange, then activations or gradients).
- cp=2: each sequence split in 2 × cp chunks over the two ranks (the cap is
  max_tokens_per_gpu × cp per micro-batch); attention exchanges keys and values every layer.

"""

from __future__ import annotations

import argparse
import json
import statistics
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
    "cp=2": {"dp": 1, "cp": 2},
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


def safe_micro_batch_sizes(max_len: int, cap: int, per_rank: int) -> list[int]:
    """Every micro_batch_size dividing the rank's samples with mbs × max_len ≤ cap."""
    return [m for m in range(1, per_rank + 1) if per_rank % m == 0 and m * max_len <= cap]


def layout_overrides(layout: str) -> list[str]:
    """The model and parallel overrides of a layout (the calibration takes the same)."""
    return [*MODEL, *(f"parallel.{key}={value}" for key, value in LAYOUTS[layout].items())]


def calibrate(layout: str, out: Path) -> Path:
    """python -m slime_hydra.calibrate for this layout and model, written to `out`."""
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra.calibrate", "--out", str(out)]
    proc = subprocess.run(
        [*cmd, "logger=jsonl", *layout_overrides(layout)], cwd=REPO, capture_output=True, text=True
    )
    if proc.returncode:
        sys.exit(f"calibration of {layout} failed:\n{proc.stderr[-3000:]}")
    print(
        *(line for line in proc.stderr.splitlines() if "slime_hydra.calibrate]" in line), sep="\n"
    )
    return out


def scenario(
    name: str,
    data: dict,
    layout: str,
    global_batch_size: int,
    cap: int,
    repeats: int,
    cost: Path | None,
) -> None:
    """Train every batching `repeats` times in alternating order on one rollout and layout;
    print medians, spreads, the simulated bubble and the prediction's ratio."""
    sizes = LAYOUTS[layout]
    max_len = int(SyntheticGRPO(**data).load().total_lengths.max())
    common = [
        "logger=jsonl",
        *layout_overrides(layout),
        f"batching.global_batch_size={global_batch_size}",
        f"batching.max_tokens_per_gpu={cap}",
        *(f"data.{key}={value}" for key, value in data.items()),
        *([f"trainer.cost={cost}"] if cost else []),
    ]
    runs = {
        "dynamic (fewest)": ["batching=dynamic"],
        "dynamic fastest": ["batching=dynamic", "batching.count=fastest"],
        **{
            f"fixed mbs={m}": ["batching=fixed", f"batching.micro_batch_size={m}"]
            for m in safe_micro_batch_sizes(max_len, cap, global_batch_size // sizes["dp"])
        },
    }
    results: dict[str, list[list[dict]]] = {label: [] for label in runs}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for label in list(runs) if r % 2 == 0 else list(runs)[::-1]:
                run_dir = Path(tmp) / f"{list(runs).index(label)}-{len(results[label])}"
                results[label].append(train(run_dir, [*common, *runs[label]])[1:])
    model = "calibrated" if cost else "analytic (uncalibrated)"
    print(
        f"\n{name}, {layout}: longest sample {max_len} tokens, cap {cap} tokens per micro-batch, "
        f"{repeats} repeats, prediction {model}"
    )
    header = ("batching", "mbs/rank", "over cap", "train s", "spread", "vs dyn", "sim s")
    header += ("sim bub", "meas/sim", "gap s")
    widths = (18, 8, 8, 8, 13, 6, 7, 7, 8, 7)
    print(
        *(
            f"{h:>{w}}" if i else f"{h:<{w}}"
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    base = None
    for label, repeated in results.items():
        seconds = [sum(row["perf/step_s"] for row in rows) for rows in repeated]
        predicted = [sum(row["sim/step_s"] for row in rows) for rows in repeated]
        rows = [row for rows in repeated for row in rows]
        median = statistics.median(seconds)
        base = base or median
        print(
            f"{label:<18} {mean(rows, 'batch/num_microbatches'):>8.1f} "
            f"{sum(row['batch/cap_violations'] for row in rows) // repeats:>8} {median:>8.2f} "
            f"{min(seconds):>6.2f}–{max(seconds):<6.2f} {base / median:>6.2f} "
            f"{statistics.median(predicted):>7.2f} {mean(rows, 'sim/bubble_frac'):>7.2f} "
            f"{statistics.median(row['perf/sim_ratio'] for row in rows):>8.2f} "
            f"{median - statistics.median(predicted):>7.2f}",
            flush=True,
        )


def mean(rows: list[dict], key: str) -> float:
    """The mean of one metric over the rows."""
    return sum(r[key] for r in rows) / len(rows)


def main() -> None:
    """Run every scenario and layout (or those named), calibrated where asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default=None)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default=None)
    parser.add_argument("--global-batch-size", type=int, default=None, help="default: 1/4 rollout")
    parser.add_argument("--max-tokens-per-gpu", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each batching (>= 3)")
    cost = parser.add_mutually_exclusive_group()
    cost.add_argument("--calibrate", action="store_true", help="calibrate each layout first")
    cost.add_argument("--cost", type=Path, default=None, help="a calibration file to use")
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error(f"--repeats={args.repeats}: medians and spreads need at least 3 repeats")
    with tempfile.TemporaryDirectory() as tmp:
        for layout in LAYOUTS:
            if args.layout not in (None, layout):
                continue
            path = args.cost
            if args.calibrate:
                path = calibrate(layout, Path(tmp) / f"{list(LAYOUTS).index(layout)}.json")
            for name, data in SCENARIOS.items():
                if args.scenario in (None, name):
                    samples = data["num_prompts"] * SyntheticGRPO().n_samples_per_prompt
                    gbs = args.global_batch_size or samples // 4
                    scenario(name, data, layout, gbs, args.max_tokens_per_gpu, args.repeats, path)


if __name__ == "__main__":
    main()
