"""Training throughput of dynamic vs fixed batching on the same rollouts, trainer=cpu.

Run: .venv/bin/python benchmarks/bench_train.py [--num-prompts 16] [--global-batch-size 32]
Each batching trains the tiny model through the real CLI (2 gloo ranks, dp=2) on the same
synthetic rollout; tokens/s is real (unpadded) tokens over the summed step times, step 0 (warm-up)
excluded. Prints one row per batching and each fixed batching's time against dynamic.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def train(run_dir: Path, common: list[str], batching: list[str]) -> list[dict]:
    """Run the CLI with these overrides; return its metrics.jsonl rows."""
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", f"hydra.run.dir={run_dir}"]
    proc = subprocess.run([*cmd, *common, *batching], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{' '.join(batching)} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def mean(rows: list[dict], key: str) -> float:
    """The mean of one metric over the rows."""
    return sum(r[key] for r in rows) / len(rows)


def main() -> None:
    """Train once per batching and print throughput."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--global-batch-size", type=int, default=32)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=8192)
    parser.add_argument("--fixed-micro-batch-sizes", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()
    common = [
        "logger=jsonl",
        f"data.num_prompts={args.num_prompts}",
        f"batching.global_batch_size={args.global_batch_size}",
    ]
    runs = {
        "dynamic": ["batching=dynamic", f"batching.max_tokens_per_gpu={args.max_tokens_per_gpu}"]
    }
    for mbs in args.fixed_micro_batch_sizes:
        runs[f"fixed mbs={mbs}"] = ["batching=fixed", f"batching.micro_batch_size={mbs}"]
    header = ("batching", "mbs/rank", "tok_imb", "dp_imb", "train s", "tok/s", "vs dyn")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (14, 8, 7, 6, 8, 8, 6), strict=True)))
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(runs.items()):
            rows = train(Path(tmp) / str(i), common, overrides)[1:]
            seconds = sum(r["perf/step_s"] for r in rows)
            tokens = sum(r["perf/tokens_per_s"] * r["perf/step_s"] for r in rows)
            base = base or tokens / seconds
            print(
                f"{name:<14} {mean(rows, 'batch/num_microbatches'):>8.1f} "
                f"{mean(rows, 'batch/token_imbalance'):>7.2f} "
                f"{mean(rows, 'batch/dp_token_imbalance'):>6.3f} "
                f"{seconds:>8.1f} {tokens / seconds:>8.0f} {tokens / seconds / base:>6.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
