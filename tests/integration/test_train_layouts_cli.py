"""trainer=cpu from the command line on pipeline layouts: the 7B experiment's pp2×vpp2 layout
scaled down, and slime's #1848 preset whose VPP round-down breaks the cap, trained and measured."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.integration.test_train_cpu import metrics, ok, run_cli

pytestmark = pytest.mark.integration

SHORT = [
    "logger=jsonl",
    "data.num_prompts=4",
    "data.n_samples_per_prompt=4",
    "data.prompt_len_median=24",
    "data.max_prompt_len=60",
    "data.response_len_median=48",
    "data.max_response_len=150",
    "batching.global_batch_size=8",
    "model.num_layers=4",
]


def test_slime_1848_round_down_trains_and_its_cap_violation_shows(tmp_path: Path) -> None:
    # Step 1 needs 3 micro-batches under the cap; #1848 rounds 3 down to 2 (g=2): one over it.
    out = ok(
        run_cli(
            tmp_path,
            *SHORT,
            "batching=slime_1848",
            "batching.max_tokens_per_gpu=384",
            "parallel.dp=1",
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.microbatch_group_size_per_vp_stage=2",
        )
    )
    assert "Launching 2 gloo workers" in out
    rows = metrics(tmp_path)
    assert [r["batch/num_microbatches"] for r in rows] == [4, 2]
    assert [r["batch/cap_violations"] for r in rows] == [0, 1]
    assert rows[1]["batch/mb_tokens_max"] > 384
    assert all(math.isfinite(r["train/loss"]) and r["train/grad_norm"] > 0 for r in rows)


def test_grpo_7b_pp2_vpp2_layout_scaled_down_trains_on_cpu(tmp_path: Path) -> None:
    # The experiment's parallel layout (tp=2, pp=2, vpp=2, g=2) on 4 CPU ranks with the tiny
    # model; sequence parallelism needs trainer=gpu, dp=1 keeps it to 4 processes.
    out = ok(
        run_cli(
            tmp_path,
            "+exp=grpo_7b_pp2_vpp2",
            "trainer=cpu",
            "model=tiny",
            "model.require_path=false",  # a random tiny model: nothing to post-train from
            *SHORT,
            "parallel.dp=1",
            "parallel.sequence_parallel=false",
            "batching.max_tokens_per_gpu=512",
            "trainer.max_steps=1",
            timeout=400,
        )
    )
    assert "Launching 4 gloo workers" in out
    (row,) = metrics(tmp_path)
    assert row["batch/num_microbatches"] % 2 == 0
    assert math.isfinite(row["train/loss"]) and row["train/grad_norm"] > 0
