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
6. calibration: `python -m slime_hydra.calibrate trainer=gpu` of the throughput model on this
   GPU (one timed pass over micro-batches of 512 tokens up to the cap), then the dynamic
   throughput run again with it as trainer.cost: its perf/sim_ratio says how right the
   calibrated step-time model is on the device (the file is copied to $OUT/calibration.json).
Results: $OUT/gpu_check.json (every run's metrics rows included), logs beside it.

The parts live in benchmarks/gpu/, a module each: settings (figures, tolerances, budgets),
wheels (the wheel list), figures (MFU arithmetic, parameter count, the safe micro-batch size, the
comparisons, the memory points), runs (command lines), results (the result JSON) — pure
functions tested on CPU by tests/unit/test_gpu_check.py — then runner (the runs under one budget)
and probe (the CUDA child process). This file is the command line. Every module imports only the
standard library at the top, so `wheels` runs under any python3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from gpu.probe import probe
from gpu.runner import check
from gpu.settings import GROUPS, REPO
from gpu.wheels import wheels_to_fetch

if str(REPO) not in sys.path:  # slime_hydra from the checkout, where it is not installed
    sys.path.insert(0, str(REPO))


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
