"""Experiments and sweeps from the command line: grpo_7b, joblib, optuna, a failing job."""

from __future__ import annotations

import json

import pytest

from tests.hardware import needs_fewer_cuda_than
from tests.integration.cli import run_cli

pytestmark = pytest.mark.integration


def rows(job_dir):
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


def test_grpo_7b_stops_at_once_on_a_machine_without_its_gpus(tmp_path):
    # model.require_path=false: past the check that asks for the weights (model.path) first.
    needs_fewer_cuda_than(8)
    out = run_cli(
        "+exp=grpo_7b", "model.require_path=false", "logger=jsonl", f"hydra.run.dir={tmp_path}"
    )
    assert out.returncode == 1
    text = out.stdout + out.stderr
    assert "trainer=gpu needs 8 CUDA GPUs" in text and "trainer=plan" in text
    assert "Traceback" not in text
    assert not any((tmp_path / name).exists() for name in ("metrics.jsonl", "schedule.json"))


def test_the_issue_sweep_reports_legacy_faults_beside_none_for_the_default(tmp_path):
    out = run_cli(
        "-m",
        "+exp=grpo_7b",
        "trainer=plan",
        "logger=jsonl",
        "batching=dynamic,slime_1848,slime_1823",
        "parallel.pp=2",
        "parallel.vpp=1,2",
        "parallel.microbatch_group_size_per_vp_stage=2",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    jobs = {p.name: rows(p) for p in tmp_path.iterdir() if p.is_dir()}
    assert len(jobs) == 6
    for name, job in jobs.items():
        assert all(r["sim/step_s"] > 0 and 0 <= r["sim/bubble_frac"] < 1 for r in job)
        if "batching=dynamic" in name:
            assert sum(r["batch/cap_violations"] + r["batch/empty_microbatches"] for r in job) == 0
    (over_cap,) = [j for n, j in jobs.items() if "slime_1848" in n and "vpp=2" in n]
    assert sum(r["batch/cap_violations"] for r in over_cap) > 0  # rounded down under VPP


def test_an_invalid_job_fails_alone_and_the_sweep_goes_on(tmp_path):
    out = run_cli(
        "-m",
        "trainer=plan",
        "logger=jsonl",
        "parallel.pp=1",
        "parallel.vpp=1,2",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    (good,) = [p for p in tmp_path.iterdir() if p.is_dir() and "vpp=1" in p.name]
    (bad,) = [p for p in tmp_path.iterdir() if p.is_dir() and "vpp=2" in p.name]
    assert len(rows(good)) == 4
    assert "parallel.pp" in (bad / "error.txt").read_text()
    assert not (bad / "metrics.jsonl").exists()
    assert out.stdout.splitlines()[-1] == f"sweep: 2 jobs, 1 failed (see {bad / 'error.txt'})"


def test_joblib_launcher_runs_two_jobs_in_parallel_processes(tmp_path):
    out = run_cli(
        "-m",
        "hydra/launcher=local_parallel",
        "trainer=plan",
        "logger=jsonl",
        "batching=dynamic,fixed",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    assert "Joblib" in out.stdout + out.stderr
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(jobs) == 2 and all(len(rows(j)) == 4 for j in jobs)
    assert out.stdout.splitlines()[-1] == f"sweep: 2 jobs, 0 failed ({tmp_path})"


def test_joblib_sweep_counts_its_failed_jobs(tmp_path):
    # A sweep dir named at the second's millionth: the count reads the dir the jobs ran in.
    out = run_cli(
        "-m",
        "hydra/launcher=local_parallel",
        "trainer=plan",
        "logger=jsonl",
        "parallel.pp=1",
        "batching=dynamic,fixed",
        "parallel.vpp=1,2",
        f"hydra.sweep.dir={tmp_path}/${{now:%H-%M-%S-%f}}",
    )
    assert out.returncode == 0, out.stderr
    (sweep,) = tmp_path.iterdir()
    bad = sorted(p / "error.txt" for p in sweep.iterdir() if "vpp=2" in p.name)
    assert [p.parent.name[:2] for p in bad] == ["1_", "3_"]
    line = f"sweep: 4 jobs, 2 failed (see {bad[0]}, {bad[1]})"
    assert out.stdout.splitlines()[-1] == line


def test_optuna_searches_the_cap_for_the_fastest_sound_schedule(tmp_path):
    out = run_cli(
        "-m",
        "hydra/sweeper=optuna_cap",
        "hydra.sweeper.n_trials=3",
        "+exp=grpo_7b",
        "trainer=plan",
        "logger=jsonl",
        f"hydra.sweep.dir={tmp_path}",
    )
    assert out.returncode == 0, out.stderr
    assert "Best parameters" in out.stdout + out.stderr
    assert len([p for p in tmp_path.iterdir() if p.is_dir()]) == 3
