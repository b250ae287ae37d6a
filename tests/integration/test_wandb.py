"""logger=wandb for real, offline: each run read back from its .wandb file, and wandb faults."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_hydra.log.sink import RunInfo
from slime_hydra.log.wandb import WandbSink
from tests.contract import BATCH_KEYS
from tests.integration.test_train_cpu import SMALL
from tests.wandb_reader import OfflineRun, read_run, wandb_files

pytestmark = pytest.mark.integration


def slime_hydra(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m slime_hydra [-m] trainer=plan OVERRIDES` with wandb's home dirs in `tmp`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    for name in ("DIR", "CACHE_DIR", "CONFIG_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        base[f"WANDB_{name}"] = str(tmp / "wandb_home")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "slime_hydra",
            *sorted(args, key=lambda a: a != "-m"),
            "trainer=plan",
        ],
        cwd=tmp,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def metrics_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl of a run dir."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def step_rows(run: OfflineRun) -> list[dict]:
    """The history rows that carry the per-step metrics."""
    return [row for row in run.history if "batch/num_microbatches" in row]


def assert_history_matches(run: OfflineRun, run_dir: Path) -> None:
    """Every key of every step (all DESIGN.md batch/* keys among them), as in metrics.jsonl."""
    expected = metrics_rows(run_dir)
    logged = step_rows(run)
    assert [r["step"] for r in logged] == [r["step"] for r in expected]
    assert [r["step"] for r in expected] == list(range(1, len(expected) + 1))  # from 1
    for got, want in zip(logged, expected, strict=True):
        assert set(BATCH_KEYS) <= set(want)
        assert {k: got.get(k) for k in want} == want
        assert got["batch/mb_tokens/_type"] == "histogram"


def test_offline_run_holds_config_history_and_summary(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = slime_hydra(tmp_path, "logger=wandb", "parallel.dp=4", f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr
    [path] = wandb_files(run_dir)
    run = read_run(path)
    assert_history_matches(run, run_dir)
    assert run.exited
    assert (run.job_type, run.name, run.group) == (
        "plan",
        f"logger=wandb,parallel.dp=4,trainer=plan-{run.run_id[:6]}",
        "",
    )
    files = path.parent / "files"  # saved with the run: the resolved config and the schedule
    for name in ("config.yaml", "schedule.json"):
        assert (files / name).read_bytes() == (run_dir / name).read_bytes()
    assert run.config["parallel"]["dp"] == 4
    assert run.config["batching"]["max_tokens_per_gpu"] == 8192
    rows = metrics_rows(run_dir)
    assert run.summary["summary/steps"] == len(rows)
    assert run.summary["summary/cap_violations_max"] == 0
    mean = sum(r["batch/num_microbatches"] for r in rows) / len(rows)
    assert run.summary["summary/num_microbatches_mean"] == pytest.approx(mean)
    assert run.summary["schedule/microbatches/_type"] == "table-file"


def test_logger_name_and_group_name_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = slime_hydra(
        tmp_path,
        "logger=wandb",
        "logger.name=cap-8k",
        "logger.group=ablation",
        "logger.notes=first try",
        f"hydra.run.dir={run_dir}",
    )
    assert out.returncode == 0, out.stderr
    [path] = wandb_files(run_dir)
    run = read_run(path)
    assert (run.name, run.group) == ("cap-8k", "ablation")


def test_two_job_multirun_gives_two_runs_in_one_group(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = slime_hydra(
        tmp_path, "-m", "logger=wandb", "batching=dynamic,slime_1823", f"hydra.sweep.dir={sweep}"
    )
    assert out.returncode == 0, out.stderr
    jobs = sorted(p for p in sweep.iterdir() if (p / "metrics.jsonl").exists())
    assert [p.name.split(",")[0] for p in jobs] == ["0_batching=dynamic", "1_batching=slime_1823"]
    runs = []
    for job in jobs:
        [path] = wandb_files(job)
        runs.append(read_run(path))
        assert_history_matches(runs[-1], job)
    assert len({r.run_id for r in runs}) == 2
    assert {r.group for r in runs} == {"sweep"}
    # Named by the job's overrides and the run id's start (unique across sweeps).
    assert [r.name.rsplit("-", 1)[0] for r in runs] == [p.name.split("_", 1)[1] for p in jobs]
    assert all(r.name.rsplit("-", 1)[1] == r.run_id[:6] for r in runs)


def test_unreachable_wandb_server_leaves_the_run_and_metrics_whole(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    out = slime_hydra(
        tmp_path,
        "logger.mode=online",
        "logger.init_timeout=2",
        f"hydra.run.dir={run_dir}",
        WANDB_API_KEY="x" * 40,
        WANDB_BASE_URL="http://127.0.0.1:9",
    )
    assert out.returncode == 0, out.stderr
    assert "wandb could not start" in out.stdout
    schedule = json.loads((run_dir / "schedule.json").read_text())
    assert len(schedule["steps"]) == 4
    assert [r["step"] for r in metrics_rows(run_dir)] == [1, 2, 3, 4]


def test_wandb_dir_under_a_regular_file_leaves_the_run_and_metrics_whole(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "wandb").write_text("a file where wandb wants its dir\n")
    out = slime_hydra(tmp_path, f"hydra.run.dir={run_dir}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("wandb could not start (NotADirectoryError") == 1
    assert len(metrics_rows(run_dir)) == 4


def test_an_invalid_mode_warns_once_and_drops_wandb(tmp_path: Path, caplog) -> None:
    run = RunInfo(tmp_path, {"seed": 1}, "run", None, "plan")
    sink = WandbSink(run, mode="no-such-mode")
    sink.log({"step": 1, "batch/num_microbatches": 3})
    sink.log({"step": 2, "batch/num_microbatches": 4})
    sink.close()
    warnings = [r for r in caplog.records if "wandb could not" in r.getMessage()]
    assert len(warnings) == 1
    assert not (tmp_path / "wandb").exists()


def train_with_wandb(tmp_path: Path, *overrides: str) -> None:
    """trainer=cpu on SMALL into tmp_path/run, logging to wandb offline; must succeed."""
    small = [o for o in SMALL if not o.startswith("logger=")]
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    out = subprocess.run(
        [
            *(sys.executable, "-W", "ignore", "-m", "slime_hydra"),
            *(f"hydra.run.dir={tmp_path / 'run'}", *small, "logger=wandb", *overrides),
        ],
        cwd=Path(__file__).resolve().parents[2],
        env={**base, "WANDB_DIR": str(tmp_path / "wandb_home"), "WANDB_MODE": "offline"},
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]


def test_a_resumed_run_accepts_wandb_links_and_logs_to_the_same_run(tmp_path: Path):
    run_dir = tmp_path / "run"
    train_with_wandb(tmp_path, "trainer.max_steps=2")
    # wandb's own relative links (latest-run, debug.log) are what the resume used to refuse.
    assert (run_dir / "wandb/latest-run").is_symlink()
    train_with_wandb(tmp_path, "trainer.resume=true")
    runs = [read_run(path) for path in wandb_files(run_dir)]  # named by start time
    assert {r.run_id for r in runs} == {(run_dir / "wandb/run_id").read_text().strip()}
    assert [[row["step"] for row in step_rows(r)] for r in runs] == [[1, 2], [3, 4]]
    assert [r["step"] for r in metrics_rows(run_dir)] == [1, 2, 3, 4]


def test_an_elastic_restart_logs_to_the_same_wandb_run_without_missing_a_step(tmp_path: Path):
    run_dir = tmp_path / "run"
    train_with_wandb(
        tmp_path, "trainer.max_restarts=1", "trainer.save_interval=2", "trainer.fail_at_step=3"
    )
    runs = [read_run(path) for path in wandb_files(run_dir)]
    assert len(runs) == 2  # one offline dir per attempt (`wandb sync --append` joins them)
    # A killed attempt's file may end before its run record; every id read is the stored one.
    ids = {r.run_id for r in runs} - {""}
    assert ids == {(run_dir / "wandb/run_id").read_text().strip()}
    # Steps count from 1: the first attempt logs steps 1 and 2, saves after step 2 and dies at
    # the start of step 3; the restart resumes from checkpoint step_000002 at step 3.
    assert [[row["step"] for row in step_rows(r)] for r in runs] == [[1, 2], [3, 4]]
    assert [r["step"] for r in metrics_rows(run_dir)] == [1, 2, 3, 4]
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert saved == ["step_000002", "step_000004"]
