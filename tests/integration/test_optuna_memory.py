"""The optuna example under its memory limit: the fastest cap that fits, not the largest cap."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.integration.cli import run_cli

pytestmark = pytest.mark.integration

FITS, TOO_BIG = 19968, 31232  # grpo_7b, distributed optimizer: ~77 and ~95 GiB per GPU


def test_optuna_prefers_the_cap_under_the_memory_limit_to_a_faster_one_over_it(tmp_path):
    out = run_cli(
        "-m",
        "hydra/sweeper=optuna_cap",
        "hydra.sweeper.n_trials=4",  # with the example's seed both caps come up
        f"batching.max_tokens_per_gpu=choice({FITS},{TOO_BIG})",
        "+exp=grpo_7b",
        "trainer=plan",
        "trainer.use_distributed_optimizer=true",
        "logger=jsonl",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    runs = {}
    for job in (p for p in tmp_path.iterdir() if p.is_dir()):
        (row,) = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        runs[OmegaConf.load(job / "config.yaml").batching.max_tokens_per_gpu] = row
    assert set(runs) == {FITS, TOO_BIG}
    # The larger cap would be faster (fewer micro-batches) but breaks trainer.memory_limit_gib.
    assert runs[TOO_BIG]["sim/step_s"] < runs[FITS]["sim/step_s"]
    assert runs[TOO_BIG]["sim/peak_memory_gib"] > 80.0 > runs[FITS]["sim/peak_memory_gib"]
    assert "over trainer.memory_limit_gib=80.0" in out.stderr + out.stdout
    best = OmegaConf.load(tmp_path / "optimization_results.yaml")
    assert best.best_params["batching.max_tokens_per_gpu"] == FITS
    assert best.best_value == pytest.approx(runs[FITS]["sim/step_s"])
