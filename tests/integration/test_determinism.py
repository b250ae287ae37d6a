"""Every rank plans alone, so the schedule must be the same in every process: planned twice in
separate interpreters with different hash seeds (set and dict-of-str orders differ), the two
schedule.json files are byte-identical."""

from __future__ import annotations

import pytest

from tests.integration.cli import run_cli

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("batching", ["dynamic", "slime_1823"])
def test_two_processes_with_different_hash_seeds_plan_the_same_schedule(tmp_path, batching):
    docs = []
    for seed in ("0", "4242"):
        run_dir = tmp_path / f"hashseed_{seed}"
        out = run_cli(
            "trainer=plan",
            "logger=jsonl",
            f"batching={batching}",
            "parallel.dp=4",
            "parallel.pp=2",
            "parallel.vpp=2",
            "batching.max_tokens_per_gpu=6000",
            f"hydra.run.dir={run_dir}",
            env={"PYTHONHASHSEED": seed},
        )
        assert out.returncode == 0, out.stderr
        docs.append((run_dir / "schedule.json").read_bytes())
    assert docs[0] == docs[1]
    assert b'"steps"' in docs[0]
