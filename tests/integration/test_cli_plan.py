"""Plan mode from the command line: run dir files re-read and re-checked from outside."""

from __future__ import annotations

import json

import pytest

from tests.contract import BATCH_KEYS
from tests.integration.cli import run_cli

pytestmark = pytest.mark.integration


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_plan_mode_writes_config_metrics_and_a_checkable_schedule(tmp_path):
    out = run_cli(
        "trainer=plan",
        "logger=console",
        "parallel.dp=4",
        "batching.max_tokens_per_gpu=6000",
        f"hydra.run.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("mb_imb") == 1  # the per-step table, once
    assert (tmp_path / "config.yaml").read_text().count("max_tokens_per_gpu: 6000") == 1
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    doc = json.loads((tmp_path / "schedule.json").read_text())
    # Steps count from 1 in schedule.json as in metrics (and wandb, the console).
    assert [s["step"] for s in doc["steps"]] == [1, 2, 3, 4]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    lengths, cap = doc["lengths"], doc["cap"]
    assert cap == 6000 and len(lengths) == 512
    seen = []
    for row, step in zip(rows, doc["steps"], strict=True):
        assert row.keys() >= set(BATCH_KEYS)
        assert len(step["ranks"]) == 4
        assert {len(rank) for rank in step["ranks"]} == {step["num_microbatches"]}
        assert row["batch/num_microbatches"] == step["num_microbatches"]
        mb_tokens = [sum(lengths[i] for i in mb) for rank in step["ranks"] for mb in rank]
        assert all(mb for rank in step["ranks"] for mb in rank)
        assert max(mb_tokens) <= cap == doc["cap"]
        assert row["batch/mb_tokens_max"] == max(mb_tokens)
        assert row["batch/cap_violations"] == row["batch/empty_microbatches"] == 0
        seen += [i for rank in step["ranks"] for mb in rank for i in mb]
    assert sorted(seen) == list(range(len(lengths)))


def test_plan_mode_prints_its_table_whatever_the_logger(tmp_path):
    out = run_cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    header, *rows = [line.split() for line in lines if not line.startswith("[")]  # "[time]" logs
    assert header[:3] == ["step", "mbs", "lb"] and "sim_s" in header
    assert [row[0] for row in rows] == ["1", "2", "3", "4"]


def test_multirun_gives_one_run_dir_per_job(tmp_path):
    out = run_cli(
        "-m",
        "trainer=plan",
        "logger=jsonl",
        "batching=fixed,dynamic",
        "batching.max_tokens_per_gpu=4096,8192",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(jobs) == 4
    for job in jobs:
        assert len(read_jsonl(job / "metrics.jsonl")) == 4
        assert (job / "schedule.json").is_file() and (job / "config.yaml").is_file()
    # fixed batching ignores the cap, so at 4096 tokens the metrics show it breaking it.
    (fixed_4096,) = [j for j in jobs if "batching=fixed" in j.name and "4096" in j.name]
    assert sum(r["batch/cap_violations"] for r in read_jsonl(fixed_4096 / "metrics.jsonl")) > 0


def assert_one_paragraph_error(out, *needles):
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "Traceback" not in text
    for needle in needles:
        assert needle in text, text


def test_unknown_override_is_a_short_error():
    out = run_cli("trainer=plan", "batching.max_token_per_gpu=1")
    assert_one_paragraph_error(out, "max_token_per_gpu")


def test_invalid_json_line_names_file_and_line(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"total_length": 10}\n{"total_length": 12,\n')
    out = run_cli("trainer=plan", "data=jsonl", f"data.path={trace}", f"hydra.run.dir={tmp_path}/r")
    assert_one_paragraph_error(out, f"{trace}:2", "not valid JSON")
    assert not (tmp_path / "r" / "schedule.json").exists()


def test_non_positive_length_is_named(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"total_length": 10}\n{"total_length": 0}\n')
    out = run_cli("trainer=plan", "data=jsonl", f"data.path={trace}", f"hydra.run.dir={tmp_path}/r")
    assert_one_paragraph_error(out, f"{trace}:2", "total_length=0")


def test_empty_rollout_is_named(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n")
    out = run_cli("trainer=plan", "data=jsonl", f"data.path={trace}", f"hydra.run.dir={tmp_path}/r")
    assert_one_paragraph_error(out, "rollout is empty")


def test_over_cap_sample_stops_before_anything_runs(tmp_path):
    out = run_cli("trainer=plan", "batching.max_tokens_per_gpu=1024", f"hydra.run.dir={tmp_path}")
    assert_one_paragraph_error(out, "batching.oversize=isolate", "batching.max_tokens_per_gpu")
    assert not (tmp_path / "metrics.jsonl").exists()
