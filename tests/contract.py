"""DESIGN.md's contracts, written out once for the tests that pin them."""

BATCH_KEYS = (
    "batch/num_microbatches",
    "batch/num_microbatches_lb",
    "batch/mb_tokens_max",
    "batch/mb_tokens_mean",
    "batch/mb_tokens_min",
    "batch/token_imbalance",
    "batch/dp_token_imbalance",
    "batch/flops_imbalance",
    "batch/cap_utilization",
    "batch/cap_violations",
    "batch/empty_microbatches",
    "batch/oversize_samples",
    "batch/plan_ms",
    "batch/mb_tokens_lb",
    "batch/dp_flops_imbalance",
)
TRAIN_KEYS = ("train/loss", "train/grad_norm", "train/lr", "perf/step_s", "perf/tokens_per_s")
SIM_KEYS = ("sim/step_s", "sim/bubble_frac", "sim/peak_tokens", "sim/peak_memory_gib")
