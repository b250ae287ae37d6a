"""A sweep job that raises something other than our error fails alone: its error.txt names the
exception, the sweep goes on (basic and joblib launchers) and its line counts it as failed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


@pytest.mark.parametrize("launcher", ["basic", "local_parallel"])
def test_a_job_raising_a_foreign_exception_fails_alone(tmp_path, launcher):
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [
        sys.executable,
        "-W",
        "ignore",
        "-m",
        "slime_hydra",
        "-m",
        f"hydra/launcher={launcher}",
        "trainer=plan",
        "logger=jsonl",
        "logger._target_=tests.faults.broken.BrokenSink",
        "seed=1,2,3",
        f"hydra.sweep.dir={tmp_path}",
    ]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    (bad,) = [p for p in tmp_path.iterdir() if p.name.startswith("1_")]
    error = (bad / "error.txt").read_text()
    assert error.startswith("RuntimeError: the logger's service is down (the traceback is in ")
    # It wrote no step, so its run files are gone again: a fixed rerun may take the dir.
    assert not (bad / "config.yaml").exists() and not (bad / "schedule.json").exists()
    line = out.stdout.splitlines()[-1]
    assert line == f"sweep: 3 jobs, 1 failed (see {bad / 'error.txt'})"
    good = [p for p in tmp_path.iterdir() if p.name[:2] in ("0_", "2_")]
    assert len(good) == 2 and all((p / "metrics.jsonl").is_file() for p in good)


@pytest.mark.parametrize("launcher", ["basic", "local_parallel"])
def test_a_swept_value_too_long_for_a_dir_name_is_refused_before_any_job(tmp_path, launcher):
    """hydra.sweep.subdir names each job's dir after its overrides: a 300-character value makes
    a name over the file system's 255 bytes, where Hydra's mkdir would raise in the launcher."""
    sweep = tmp_path / "sweep"
    out = run_sweep(f"hydra/launcher={launcher}", f"model.name={'a' * 300},tiny", sweep)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    assert f"job 0 of this sweep would run in {sweep}/0_" in text
    assert "a name of 339 bytes where the file system allows 255" in text
    assert "hydra.sweep.subdir='${hydra.job.num}'" in text
    assert sorted(p.name for p in sweep.iterdir()) == []  # no job ran, not even the short one


def test_job_dirs_by_number_take_the_long_value(tmp_path):
    """The fix the refusal names: the same sweep with job dirs named by number runs."""
    sweep = tmp_path / "sweep"
    out = run_sweep(f"model.name={'a' * 300},tiny", "hydra.sweep.subdir=${hydra.job.num}", sweep)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert out.stdout.splitlines()[-1] == f"sweep: 2 jobs, 0 failed ({sweep})"


def test_a_job_path_too_long_for_the_file_system_is_refused(tmp_path):
    """Names each within the limit, but 20 levels of 250 bytes exceed PATH_MAX (4096)."""
    sweep = tmp_path / "sweep"
    subdir = "/".join(["${hydra.job.num}" + "b" * 249] * 20)
    out = run_sweep("seed=1,2", f"hydra.sweep.subdir={subdir}", sweep)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-4000:]
    assert "job 0 of this sweep would run in " in text and "where it allows 4095" in text


@pytest.mark.parametrize(
    ("subdir", "needle"),
    [
        ("same", "jobs 0 and 1 of this sweep would both run in {sweep}/same: "),
        (".", "jobs 0 and 1 of this sweep would both run in {sweep}: "),
        ("../escape", "job 0 of this sweep would run in {tmp}/escape, outside hydra.sweep.dir"),
    ],
    ids=["shared", "the_sweep_dir", "outside"],
)
def test_job_dirs_that_are_not_one_per_job_below_the_sweep_dir_are_refused(
    tmp_path, subdir, needle
):
    """A fixed subdir gave 'sweep: 1 jobs, 1 failed' for three jobs, each after the first
    refused in the first's dir; '..' ran the jobs outside the sweep dir."""
    sweep = tmp_path / "sweep"
    out = run_sweep("seed=1,2,3", f"hydra.sweep.subdir={subdir}", sweep)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-4000:]
    assert needle.format(sweep=sweep, tmp=tmp_path) in text, text[-4000:]
    assert "hydra.sweep.subdir='${hydra.job.num}'" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]
    assert list(sweep.iterdir()) == []


def test_job_dirs_named_from_the_jobs_config_are_checked_with_each_jobs_values(tmp_path):
    """hydra.sweep.subdir=${seed} was resolved with the base config's seed (1234) for every
    job, so a sound sweep was refused as two jobs in one dir."""
    sweep = tmp_path / "sweep"
    out = run_sweep("seed=1,2", "hydra.sweep.subdir=${seed}", sweep)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert out.stdout.splitlines()[-1] == f"sweep: 2 jobs, 0 failed ({sweep})"
    assert (sweep / "1/metrics.jsonl").is_file() and (sweep / "2/metrics.jsonl").is_file()
    again = tmp_path / "again"
    out = run_sweep("seed=1,1", "hydra.sweep.subdir=${seed}", again)
    assert out.returncode == 1, (out.stdout + out.stderr)[-4000:]
    assert f"jobs 0 and 1 of this sweep would both run in {again / '1'}: " in out.stderr


def run_sweep(*overrides: str | Path) -> subprocess.CompletedProcess[str]:
    """A plan-mode sweep; a Path is the sweep dir."""
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    args = [f"hydra.sweep.dir={o}" if isinstance(o, Path) else o for o in overrides]
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", "-m", "trainer=plan", *args]
    cmd.append("logger=jsonl")
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("subdir", ["${hydra.job.num}", "${hydra.job.num}/below"])
def test_a_file_where_a_job_dir_goes_is_refused_before_any_job(tmp_path, subdir):
    """Hydra's mkdir raised FileExistsError after job 0 ran: a traceback, and no sweep line."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "1").write_text("x")
    out = run_sweep("seed=1,2", f"hydra.sweep.subdir={subdir}", sweep)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-4000:]
    job, where = (
        (sweep / "1", "that") if "below" not in subdir else (sweep / "1/below", sweep / "1")
    )
    assert f"job 1 of this sweep would run in {job}, but {where} is a file, not a dir" in text
    assert "No job was run" in text
    assert sorted(p.name for p in sweep.iterdir()) == ["1"]


def test_a_sweep_jobs_file_that_is_a_dir_is_refused_before_any_job(tmp_path):
    """Each job appends its start there: a dir in its place raised IsADirectoryError in the
    first job, with a traceback and no sweep line."""
    sweep = tmp_path / "sweep"
    (sweep / "sweep_jobs.jsonl").mkdir(parents=True)
    out = run_sweep("seed=1,2", sweep)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-4000:]
    assert f"{sweep / 'sweep_jobs.jsonl'} is not a regular file" in text
    assert "No job was run" in text
    assert sorted(p.name for p in sweep.iterdir()) == ["sweep_jobs.jsonl"]


OPTUNA = ("hydra/sweeper=optuna_cap", "hydra.sweeper.n_trials=3")
"""A sweeper that picks its jobs as it runs: its job dirs are checked as each job starts."""


@pytest.mark.parametrize(
    ("launcher", "subdir", "needle", "line"),
    [
        (
            "basic",
            "same",
            "jobs 0 and 1 of this sweep would both run in {sweep}/same: ",
            "sweep: 3 jobs, 2 failed (see {sweep}/same)",
        ),
        (  # two trials at a time: which of the first two runs is the race's
            "local_parallel",
            "same",
            " of this sweep would both run in {sweep}/same: ",
            "sweep: 3 jobs, 2 failed (see {sweep}/same)",
        ),
        (
            "basic",
            ".",
            "job 0 of this sweep would run in {sweep}, the sweep dir itself",
            "sweep: 3 jobs, 3 failed (see {sweep})",
        ),
    ],
    ids=["shared", "shared_parallel", "the_sweep_dir"],
)
def test_another_sweepers_job_dirs_are_checked_as_each_job_starts(
    tmp_path, launcher, subdir, needle, line
):
    """optuna's trials in one dir were refused as 'already holds a run ... trainer.resume=true',
    and in the sweep dir or outside it they ran there."""
    sweep = tmp_path / "sweep"
    args = (*OPTUNA, f"hydra/launcher={launcher}", f"hydra.sweep.subdir={subdir}", sweep)
    if launcher == "local_parallel":
        args = ("hydra.sweeper.n_jobs=2", *args)
    out = run_sweep(*args)
    text = out.stdout + out.stderr
    assert out.returncode == 0 and "Traceback" not in text, text[-4000:]
    assert needle.format(sweep=sweep, tmp=tmp_path) in text, text[-4000:]
    assert "hydra.sweep.subdir='${hydra.job.num}'" in text
    assert "already holds a run" not in text
    assert out.stdout.splitlines()[-1] == line.format(sweep=sweep)
    for where in (sweep, tmp_path / "escape"):
        assert not (where / "config.yaml").exists() and not (where / "error.txt").exists()


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (
            (f"data.num_prompts=choice(4,{'9' * 300})",),
            "trial 2 of this sweep (each swept key at its longest value) would run in "
            "{sweep}/2_batching.max_tokens_per_gpu=32256,data.num_prompts=999",
        ),
        (
            ("hydra.sweep.subdir=../escape",),
            "trial 2 of this sweep (each swept key at its longest value) would run in "
            "{tmp}/escape, outside hydra.sweep.dir",
        ),
    ],
    ids=["name_too_long", "outside"],
)
def test_an_optuna_sweeps_trial_dirs_are_checked_before_any_trial(tmp_path, overrides, needle):
    """A choice too long for a dir name failed in Hydra's launcher with a traceback before any
    of our code ran; '..' ran every trial, each refused as it started."""
    sweep = tmp_path / "sweep"
    out = run_sweep(*OPTUNA, *overrides, sweep)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-4000:]
    assert needle.format(sweep=sweep, tmp=tmp_path) in text, text[-4000:]
    assert "hydra.sweep.subdir='${hydra.job.num}'" in text and "No job was run" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]
    assert list(sweep.iterdir()) == []


@pytest.mark.parametrize(
    ("launcher", "signum", "rc", "why"),
    [
        ("basic", signal.SIGINT, 130, "SIGINT"),
        ("basic", signal.SIGTERM, 143, "SIGTERM"),
        ("local_parallel", signal.SIGKILL, 1, "exit status 1, after the error above"),
    ],
    ids=["sigint", "sigterm", "killed_worker"],
)
def test_a_sweep_stopped_inside_hydras_job_setup_ends_with_its_line(
    tmp_path, launcher, signum, rc, why
):
    """A signal while Hydra sets job 1 up (in the sweep's process: basic) gave a raw traceback
    and no sweep line; a joblib worker killed there aborts the sweep in joblib (Hydra's and
    joblib's: the error above the line is theirs), and the sweep had no line either."""
    sweep = tmp_path / "sweep"
    callback = "+hydra.callbacks.signal_in_setup"
    out = run_sweep(
        f"hydra/launcher={launcher}",
        *(("hydra.launcher.n_jobs=2",) if launcher == "local_parallel" else ()),
        "seed=1,2,3",
        f"{callback}._target_=tests.faults.broken.SignalInSetup",
        f"{callback}.num=1",
        f"{callback}.signum={int(signum)}",
        sweep,
    )
    text = out.stdout + out.stderr
    assert out.returncode == rc, text[-4000:]
    (job1,) = [p for p in sweep.iterdir() if p.name.startswith("1_")]
    line = out.stdout.splitlines()[-1]
    if signum == signal.SIGKILL:  # jobs 0 and 2 may have started beside it, ended or not
        assert re.fullmatch(
            rf"sweep: [123] jobs, [123] failed \(see .*{re.escape(str(job1))}.*\); "
            rf"it stopped before its end \({why}\)",
            line,
        ), line
        return
    assert line == f"sweep: 2 jobs, 1 failed (see {job1}); it stopped before its end ({why})"
    assert "Traceback" not in text, text[-4000:]
    name = signal.Signals(signum).name
    assert f"stopped by {name} outside any job (Hydra was setting one up)." in out.stderr
