"""trainer=cpu end to end: `python -m slime_hydra` starting gloo workers (elastic launcher),
torchrun's own workers, tp=2, resume, and a killed worker brought back by the launcher."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# 32 short samples, 4 steps of 8: each run is start-up (~15 s), not training.
SMALL = [
    "logger=jsonl",
    "data.num_prompts=8",
    "data.n_samples_per_prompt=4",
    "data.prompt_len_median=32",
    "data.max_prompt_len=64",
    "data.response_len_median=64",
    "data.max_response_len=192",
    "batching.global_batch_size=8",
]
pytestmark = pytest.mark.integration


def run_cli(run_dir: Path, *overrides: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m slime_hydra hydra.run.dir=RUN_DIR OVERRIDES` from the repo root."""
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", f"hydra.run.dir={run_dir}"]
    return subprocess.run(
        [*cmd, *overrides], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def metrics(run_dir: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def ok(proc: subprocess.CompletedProcess) -> str:
    """Assert a clean exit; return stdout + stderr."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The small run on 2 DP ranks, uninterrupted: the losses others must reproduce."""
    run_dir = tmp_path_factory.mktemp("reference")
    ok(run_cli(run_dir, *SMALL))
    rows = metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    return rows


def losses(rows: list[dict]) -> list[float]:
    """train/loss per row."""
    return [r["train/loss"] for r in rows]


def test_default_command_trains_tiny_model_on_two_ranks(tmp_path: Path) -> None:
    out = ok(run_cli(tmp_path, timeout=300))
    rows = metrics(tmp_path)
    assert "Launching 2 gloo workers" in out
    assert "warm-up: forward and backward of the largest micro-batch" in out
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 3
    assert f"step {len(rows)}/{len(rows)} " in out
    assert all(math.isfinite(x) for x in losses(rows))
    assert losses(rows)[-1] < losses(rows)[0]
    for key in (
        "train/grad_norm",
        "train/lr",
        "perf/step_s",
        "perf/tokens_per_s",
        "batch/num_microbatches",
        "batch/token_imbalance",
    ):
        assert key in rows[0]


def test_torchrun_workers_share_one_run_dir(tmp_path: Path, reference: list[dict]) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, "RUN_DIR": str(run_dir), "PYTHON": sys.executable, "NPROC": "2"}
    proc = subprocess.run(
        ["bash", str(REPO / "launch/torchrun.sh"), *SMALL],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    ok(proc)
    assert (run_dir / "schedule.json").is_file() and (run_dir / "config.yaml").is_file()
    assert losses(metrics(run_dir)) == pytest.approx(losses(reference), rel=1e-5)


def test_tensor_parallel_two_ranks_matches_data_parallel(
    tmp_path: Path, reference: list[dict]
) -> None:
    ok(run_cli(tmp_path, *SMALL, "parallel.dp=1", "parallel.tp=2", "trainer.max_steps=2"))
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    # Same seed, same weights (split over 2 TP ranks), the same global batch: the same losses.
    assert losses(rows) == pytest.approx(losses(reference)[:2], rel=1e-4)
    assert rows[0]["train/grad_norm"] == pytest.approx(reference[0]["train/grad_norm"], rel=1e-4)


def test_warmup_leaves_the_training_as_it_was(tmp_path: Path, reference: list[dict]) -> None:
    # The reference warmed up (the default); a warm-up that updated the weights or left its
    # gradients in step 1's would change every loss after the first or step 1's gradient norm.
    out = ok(run_cli(tmp_path, *SMALL, "trainer.warmup=false"))
    assert "warm-up:" not in out
    rows = metrics(tmp_path)
    assert losses(rows) == pytest.approx(losses(reference), rel=1e-5)
    grad_norms = [r["train/grad_norm"] for r in rows]
    assert grad_norms == pytest.approx([r["train/grad_norm"] for r in reference], rel=1e-5)


def test_resume_continues_from_last_checkpoint(tmp_path: Path, reference: list[dict]) -> None:
    ok(run_cli(tmp_path, *SMALL, "trainer.max_steps=2"))
    assert (tmp_path / "checkpoints/latest").read_text().strip() == "2"
    assert [p.name for p in (tmp_path / "checkpoints").glob("step_*")] == ["step_000002"]
    out = ok(run_cli(tmp_path, *SMALL, "trainer.resume=true"))
    assert "Resuming after step 2 " in out
    assert "step 3/4 " in out and "step 2/4 " not in out  # the resumed run starts at step 3
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert losses(rows) == pytest.approx(losses(reference), rel=1e-5)


def test_killed_worker_restarts_and_resumes(tmp_path: Path, reference: list[dict]) -> None:
    out = ok(
        run_cli(
            tmp_path,
            *SMALL,
            "trainer.max_restarts=1",
            "trainer.save_interval=2",
            "trainer.fail_at_step=4",
        )
    )
    assert "trainer.fail_at_step=4: rank 1 exits now" in out
    assert "Resuming after step 2 (restart 1)" in out
    saved = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert saved == ["step_000002", "step_000004"]
    # Step 3 ran before the kill (step 4's start) and again after the restart from the
    # checkpoint after step 2: printed twice, in metrics.jsonl once.
    assert out.count("step 3/4 ") == 2 and out.count("step 4/4 ") == 1
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert losses(rows) == pytest.approx(losses(reference), rel=1e-5)
