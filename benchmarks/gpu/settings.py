"""What the check measures with and against: the H200's figures, the models, the seed, the
tolerances, the rollouts, the steps and the budget of each part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
"""The repository root, where the CLI runs."""


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


GROUPS = ("loss", "throughput", "memory", "fp16", "probe", "calibration")
"""The parts of `check`, in the order they run: the headline figures first."""


CALIBRATION_REPEATS = 1


CALIBRATION_MIN_TOKENS = 512
"""python -m slime_hydra.calibrate on THROUGHPUT_MODEL at dp=1: one timed pass over the grid of
micro-batches from 512 tokens (below the throughput rollout's fixed micro-batches) up to the
cap, so that the whole part fits the check's budget."""


CALIBRATION_FILE = "calibration.json"
"""What the calibration writes into its run dir; the check copies it to $OUT."""


PROBE_MIN_S = 40
"""Budget seconds the probe needs left to start (a CUDA context, two tiny models, attention)."""


LOSS_DATA: dict[str, Any] = {"num_prompts": 8, "n_samples_per_prompt": 8}


LOSS_GBS = 32


LOSS_STEPS = 2


FP16_GBS = 2


FP16_STEPS = 30
"""The fp16 run: 30 steps of 2 samples of LOSS_DATA, room for megatron's loss scale to come
down from 2**32 (one halving per overflow after the first two) before an update applies."""
