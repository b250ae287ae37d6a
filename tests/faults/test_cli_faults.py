"""The run-dir faults of issue 11 from the command line: a refused run exits 1 with one
paragraph, no traceback, and leaves every file of the run dir as it was (checksums)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from slime_hydra.rundir import RunDirLock
from tests.faults.rundir import assert_untouched, snapshot
from tests.faults.test_run_state import reordered
from tests.integration.test_train_cpu import SMALL

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def cli(*overrides: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def refused(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    for needle in needles:
        assert needle in text, text[-4000:]
    return text


def steps(run_dir: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_second_plan_into_the_same_dir_is_refused_and_changes_nothing(tmp_path):
    assert cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={tmp_path}").returncode == 0
    before = snapshot(tmp_path)
    out = cli("trainer=plan", "logger=jsonl", "parallel.dp=2", f"hydra.run.dir={tmp_path}")
    refused(out, "already holds a run", "hydra.run.dir")
    assert_untouched(before, tmp_path)
    assert steps(tmp_path) == [1, 2, 3, 4]


def test_a_second_sweep_into_the_same_sweep_dir_leaves_the_first_whole(tmp_path):
    sweep = ["-m", "trainer=plan", "logger=jsonl", "batching=fixed,dynamic"]
    assert cli(*sweep, f"hydra.sweep.dir={tmp_path}").returncode == 0
    before = snapshot(tmp_path)
    out = cli(*sweep, f"hydra.sweep.dir={tmp_path}")
    assert out.returncode == 0  # a sweep goes on past failed jobs
    assert (out.stdout + out.stderr).count("already holds a run") == 2
    # Hydra writes this sweep's multirun.yaml; the first sweep's is kept beside it.
    assert (tmp_path / "multirun.1.yaml").read_bytes() == before["multirun.yaml"]
    jobs = (tmp_path / "sweep_jobs.jsonl").read_bytes()
    assert jobs.startswith(before["sweep_jobs.jsonl"])  # the sweep's job records only grow
    ignore = ("multirun.yaml", "multirun.1.yaml", "sweep_jobs.jsonl")
    assert_untouched(before, tmp_path, ignore=ignore)
    assert not list(tmp_path.rglob("error.txt"))
    # Both jobs of this sweep were refused; the first sweep's successes are not counted.
    assert out.stdout.splitlines()[-1].startswith("sweep: 2 jobs, 2 failed (see ")


def test_a_run_into_a_locked_dir_fails_at_once_naming_the_holder(tmp_path):
    lock = RunDirLock(tmp_path).acquire()
    try:
        before = snapshot(tmp_path)
        out = cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={tmp_path}")
        refused(out, f"in use by another run (pid {os.getpid()}")
        assert_untouched(before, tmp_path)
    finally:
        lock.release()


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two steps on two CPU ranks, a checkpoint after each (named by the steps done)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    out = cli(f"hydra.run.dir={run_dir}", *SMALL, "trainer.max_steps=2", "trainer.save_interval=1")
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert saved == ["step_000001", "step_000002"]
    assert (run_dir / "checkpoints/latest").read_text() == "2\n"
    assert steps(run_dir) == [1, 2]
    return run_dir


@pytest.fixture
def run_dir(trained: Path, tmp_path: Path) -> Path:
    """A copy of the trained run dir for one test to damage."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    (copy / ".lock").write_text("")
    return copy


def test_rerunning_a_trained_dir_without_resume_is_refused(run_dir):
    before = snapshot(run_dir)
    refused(cli(f"hydra.run.dir={run_dir}", *SMALL), "already holds a run", "trainer.resume=true")
    assert_untouched(before, run_dir)


def test_a_resume_with_a_changed_schedule_key_is_refused_before_writing(run_dir):
    before = snapshot(run_dir)
    out = cli(f"hydra.run.dir={run_dir}", *SMALL, "trainer.resume=true", "batching=fixed")
    refused(out, "trainer.resume=true refused", "batching._target_", str(run_dir / "config.yaml"))
    assert_untouched(before, run_dir)  # config.yaml, schedule.json, .hydra/ as they were


class RunsCode:
    def __reduce__(self):
        return (os.system, ("touch /tmp/slime_hydra_cli_pwned",))


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(run_dir):
    path = run_dir / "checkpoints/step_000002/rank_000.pt"
    torch.save({"steps_done": 2, "schedule": "x", "model": RunsCode(), "optimizer": {}}, path)
    before = snapshot(run_dir)
    out = cli(f"hydra.run.dir={run_dir}", *SMALL, "trainer.resume=true")
    refused(out, "rank_000.pt holds objects that only a full unpickler", "was not loaded")
    assert not Path("/tmp/slime_hydra_cli_pwned").exists()
    assert_untouched(before, run_dir)


def refused_before_launch(
    run_dir: Path, rank_file: str, edit: Callable[[dict], None], needle: str
) -> None:
    """Edit a rank's checkpoint of the trained run with `edit` and resume: refused with `needle`
    before any worker started, and the dir left as it was."""
    path = run_dir / "checkpoints/step_000002" / rank_file
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)
    before = snapshot(run_dir)
    out = cli(f"hydra.run.dir={run_dir}", *SMALL, "trainer.resume=true")
    assert "Launching" not in refused(out, needle)
    assert_untouched(before, run_dir)


def test_a_checkpoint_with_edited_tensors_is_refused_before_launch(run_dir):
    def edit(state: dict) -> None:
        state["model"] = {
            k: v[..., :1].clone() if isinstance(v, torch.Tensor) and v.dim() else v
            for k, v in state["model"].items()
        }

    refused_before_launch(
        run_dir,
        "rank_000.pt",
        edit,
        "rank_000.pt: model/0.decoder.final_layernorm.weight has shape [1], but it was "
        "saved with shape [128]: the file was edited after it was saved",
    )


def test_a_checkpoint_of_another_model_shape_is_refused_before_launch(run_dir):
    """Its tensors and their shape record edited alike: this run's model shapes refuse it."""
    key = "0.decoder.layers.1.mlp.linear_fc2.weight"

    def edit(state: dict) -> None:
        state["model"][key] = state["model"][key][:, :256].clone()
        state["shapes"][f"model/{key}"] = [128, 256]

    refused_before_launch(
        run_dir,
        "rank_001.pt",
        edit,
        f"rank_001.pt: this run's model gives rank 1 the weight {key} with shape [128, 512] "
        "(model.hidden_size=128, model.ffn_hidden_size=512, parallel.tp=1), and the file holds "
        "shape [128, 256]",
    )


def test_adam_moments_of_another_shape_are_refused_before_launch(run_dir):
    """Moments edited with their shape record, so only the parameters they belong to tell: the
    resume is refused before any worker starts, and the dir is left as it was."""

    def edit(state: dict) -> None:
        state["optimizer"]["state"][4]["exp_avg_sq"] = torch.zeros(3)
        state["shapes"]["optimizer/state/4/exp_avg_sq"] = [3]

    refused_before_launch(
        run_dir,
        "rank_000.pt",
        edit,
        "rank_000.pt: the optimizer's exp_avg_sq of parameter 4 "
        "(0.decoder.layers.0.mlp.linear_fc2.weight) has shape [3], and this run's model gives "
        "that weight [128, 512]",
    )


def test_reordered_keys_with_moments_permuted_to_match_are_refused_before_launch(run_dir):
    """The file's keys reversed and its moments permuted so that, paired in the file's order,
    each has its weight's shape: the workers pair them in the model's order, so it failed there.
    Refused before launch; the dir is left as it was."""
    refused_before_launch(
        run_dir,
        "rank_000.pt",
        lambda state: reordered(state, permute_moments=True),
        "rank_000.pt: the optimizer's exp_avg of parameter 1 "
        "(0.decoder.layers.0.self_attention.linear_proj.weight) has shape [128, 512], and this "
        "run's model gives that weight [128, 128]: torch pairs saved moments with this run's "
        "parameters by position in the model's order",
    )


def test_resume_after_a_torn_line_applies_a_changed_lr_and_logs_each_step_once(run_dir):
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 3, "train/lo')  # killed mid-write
    out = cli(f"hydra.run.dir={run_dir}", *SMALL, "trainer.resume=true", "trainer.lr=0.002")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "trainer.lr: 0.001 → 0.002" in text and "torn last line" in text
    assert "Resuming after step 2 " in text and "step 3/4" in text and "step 2/4" not in text
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["train/lr"] for r in rows] == [0.001, 0.001, 0.002, 0.002]


def test_a_non_finite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    out = cli(f"hydra.run.dir={tmp_path}", *SMALL, "trainer.lr=1e30", "trainer.save_interval=1")
    refused(out, "is not finite", "trainer.skip_nonfinite=true", "failed on rank 0")
    text = out.stdout + out.stderr
    bad = int(text.split("): step ")[1].split(":")[0])  # steps count from 1
    assert bad >= 2  # step 1's loss is finite; its huge update breaks a later one
    assert f"the last good checkpoint is after step {bad - 1} " in text
    assert (tmp_path / "checkpoints/latest").read_text().strip() == str(bad - 1)
    assert steps(tmp_path) == list(range(1, bad))


def test_swapped_rank_files_are_refused_before_launch(run_dir):
    step = run_dir / "checkpoints/step_000002"
    (step / "rank_000.pt").rename(step / "swap.pt")
    (step / "rank_001.pt").rename(step / "rank_000.pt")
    (step / "swap.pt").rename(step / "rank_001.pt")
    before = snapshot(run_dir)
    out = cli(f"hydra.run.dir={run_dir}", *SMALL, "trainer.resume=true")
    text = refused(out, "rank_000.pt was saved by rank 1, not rank 0")
    assert "Launching" not in text  # refused before any worker started
    assert_untouched(before, run_dir)


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("middle_line", "metrics.jsonl:1: not a metrics row"),
        ("non_utf8_middle", "metrics.jsonl:1: not a metrics row (byte 0xff at column 2"),
        ("a_dir", "metrics.jsonl is not a regular file"),
        ("empty_config", "config.yaml is empty, not the config of a run"),
        ("latin1_config", "config.yaml is not UTF-8 text: byte 0xe9"),
        ("arabic_latest", "holds '٣', not a step count"),
        ("alias_bomb_config", "config.yaml is not readable YAML (found an alias (*name), which"),
        ("lock_dir", ".lock is a directory: it must be the run dir's lock file"),
        ("lock_fifo", ".lock is not a regular file (a FIFO?): it must be the run dir's lock"),
        ("checkpoints_file", "checkpoints is not a directory, so it holds no checkpoints"),
    ],
)
def test_a_damaged_run_dir_is_refused_on_resume_before_anything_is_written(run_dir, damage, needle):
    """alias_bomb_config: nested YAML aliases (a billion "x") were a MemoryError or the OOM
    killer; lock_dir: IsADirectoryError's traceback; checkpoints_file: 'holds no checkpoint'."""
    metrics, config = run_dir / "metrics.jsonl", run_dir / "config.yaml"
    if damage == "middle_line":
        metrics.write_text('{"step": 1, "train/lo\n' + metrics.read_text().splitlines()[1] + "\n")
    elif damage == "non_utf8_middle":
        metrics.write_bytes(b'{\xff"step": 1}\n' + metrics.read_bytes().splitlines()[1] + b"\n")
    elif damage == "a_dir":
        metrics.unlink()
        metrics.mkdir()
    elif damage == "empty_config":
        config.write_text("")
    elif damage == "latin1_config":
        config.write_bytes(config.read_bytes() + "# café\n".encode("latin-1"))
    elif damage == "alias_bomb_config":
        rows = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
        pairs = zip("abcdefgh", "bcdefghi", strict=True)
        rows += [f"{b}: &{b} [{','.join([f'*{a}'] * 9)}]" for a, b in pairs]
        config.write_text("\n".join(rows) + "\n")
    elif damage == "lock_dir":
        (run_dir / ".lock").unlink()
        (run_dir / ".lock").mkdir()
    elif damage == "lock_fifo":  # os.pread on it: OSError 'Illegal seek', a traceback
        (run_dir / ".lock").unlink()
        os.mkfifo(run_dir / ".lock")
    elif damage == "checkpoints_file":
        shutil.rmtree(run_dir / "checkpoints")
        (run_dir / "checkpoints").write_text("not a dir\n")
    else:
        (run_dir / "checkpoints/latest").write_text("٣\n")
    before = snapshot(run_dir)
    refused(cli(f"hydra.run.dir={run_dir}", *SMALL, "trainer.resume=true"), needle)
    assert_untouched(before, run_dir)


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (("hydra.run.dir=",), "hydra.run.dir"),
        (("-m", "seed=1,2", "hydra.sweep.dir= "), "hydra.sweep.dir"),
    ],
    ids=["run", "sweep"],
)
def test_an_empty_run_or_sweep_dir_is_refused_not_the_current_dir(tmp_path, args, key):
    """An empty hydra.run.dir (an unset shell variable) wrote the run into the current dir."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", *args, "trainer=plan"]
    out = subprocess.run(
        [*cmd, "logger=jsonl"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    refused(out, f"{key} is empty, which would write the run's files into the current directory")
    assert list(tmp_path.iterdir()) == []


def test_a_run_that_fails_before_its_first_step_leaves_the_dir_to_a_fixed_rerun(tmp_path):
    # The last rank exits at the start of step 1: no metrics row, no checkpoint.
    out = cli(f"hydra.run.dir={tmp_path}", *SMALL, "trainer.fail_at_step=1")
    assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr
    assert sorted(os.listdir(tmp_path)) == [".lock", "slime_hydra.log"]
    assert (tmp_path / ".lock").read_bytes() == b""
    again = cli(f"hydra.run.dir={tmp_path}", *SMALL, "trainer.max_steps=1")
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert steps(tmp_path) == [1]


@pytest.mark.parametrize(
    ("name", "shown"),
    [("../escape", "'../escape'"), ("logs/job", "'logs/job'"), ("n" * 300, "'nnnnn")],
    ids=["parent", "subdir", "too_long"],
)
def test_a_job_name_that_is_no_plain_file_name_is_refused_before_any_log(tmp_path, name, shown):
    """hydra.job.name names <run dir>/<name>.log: '../escape' wrote tmp_path/escape.log,
    outside the run dir, and 'logs/job' was logging's traceback."""
    run_dir = tmp_path / "run"
    out = cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={run_dir}", f"hydra.job.name={name}")
    refused(out, f"hydra.job.name={shown}", "must be a plain file name", "Drop the override")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither the run dir nor a log


def test_hydra_writing_its_snapshot_itself_is_refused_and_changes_nothing(tmp_path):
    """hydra.output_subdir=.hydra: Hydra rewrote .hydra/ before the dir refused the run."""
    assert cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={tmp_path}").returncode == 0
    before = snapshot(tmp_path)
    out = cli(
        "trainer=plan", "logger=jsonl", f"hydra.run.dir={tmp_path}", "hydra.output_subdir=.hydra"
    )
    refused(out, "hydra.output_subdir='.hydra': Hydra would write its config snapshot there")
    assert_untouched(before, tmp_path)


def as_unprivileged() -> list[str]:
    """A command prefix under which file permissions apply: root keeps its uid (and so can run
    the venv in /root) but loses the capabilities that bypass them."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be made to apply")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.mark.parametrize(
    ("key", "where"),
    [("hydra.run.dir", "ro"), ("hydra.run.dir", "ro/run"), ("hydra.sweep.dir", "ro")],
)
def test_a_read_only_run_dir_is_one_paragraph(tmp_path, key, where):
    (tmp_path / "ro").mkdir(mode=0o500)
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [*as_unprivileged(), sys.executable, "-W", "ignore", "-m", "slime_hydra"]
    cmd += ["-m"] * (key == "hydra.sweep.dir") + ["trainer=plan", "logger=jsonl", "seed=1"]
    out = subprocess.run(
        [*cmd, f"{key}={tmp_path / where}"], cwd=REPO, env=env, capture_output=True, text=True
    )
    refused(out, f"{key}={tmp_path / where} cannot be a run dir: this user may not create or write")
    assert os.listdir(tmp_path / "ro") == []


def test_a_report_into_a_read_only_run_dir_names_out(tmp_path):
    run = tmp_path / "run"
    assert cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={run}").returncode == 0
    run.chmod(0o500)
    cmd = [*as_unprivileged(), sys.executable, "-W", "ignore", "-m", "slime_hydra.report", str(run)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert f"the report of {run} cannot be written to {run / 'report'}: Permission denied" in (
        out.stderr
    )
    assert "Pass --out DIR to write it elsewhere." in out.stderr


def test_a_dir_planted_as_the_runs_log_file_is_one_paragraph_and_a_sweep_goes_on(tmp_path):
    """Hydra's job log opens through our handler: a dir at its name raised in Hydra's logging
    setup, a traceback that aborted the whole sweep. The run is refused (its dir as it was),
    and in a sweep that job alone fails."""
    run = tmp_path / "run"
    (run / "slime_hydra.log").mkdir(parents=True)
    before = snapshot(run)
    out = cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={run}")
    refused(out, f"{run / 'slime_hydra.log'} cannot be opened as the run's log file (Is a ")
    assert_untouched(before, run)
    assert sorted(p.name for p in run.iterdir()) == ["slime_hydra.log"]
    sweep = tmp_path / "sweep"
    job1 = sweep / "1_logger=jsonl,seed=2,trainer=plan"
    (job1 / "slime_hydra.log").mkdir(parents=True)
    out = cli("-m", "trainer=plan", "logger=jsonl", "seed=1,2,3", f"hydra.sweep.dir={sweep}")
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stderr[-4000:]
    assert out.stdout.splitlines()[-1] == f"sweep: 3 jobs, 1 failed (see {job1})"
