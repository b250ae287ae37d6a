"""Symlinks planted in a run dir never redirect a write outside it: every file the project
creates there is made without following links, and a run into a dir holding one is refused
before anything is written (checksums of the run dir and of the links' targets, before/after)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import check_inside, open_append, write_dir, write_file, write_files
from tests.faults.rundir import snapshot

REPO = Path(__file__).resolve().parents[2]


def cli(*overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """Files and a dir elsewhere, which planted links point at."""
    d = tmp_path / "outside"
    (d / "dir").mkdir(parents=True)
    for name in ("pid", "config", "log", "schedule", "metrics"):
        (d / name).write_text(f"the user's {name} file\n")
    return d


# Each entry a run creates, planted as a link to a file (or dir) outside the run dir.
PLANTS = {
    ".lock": "pid",
    ".config.yaml.tmp": "config",
    "slime_hydra.log": "log",
    "schedule.json": "schedule",
    "metrics.jsonl": "metrics",
    ".hydra": "dir",
    "checkpoints": "dir",
    "wandb": "dir",  # wandb's links inside it are accepted, the dir itself may not be one
}


@pytest.mark.integration
@pytest.mark.parametrize("entry", sorted(PLANTS))
def test_a_plan_into_a_dir_with_a_planted_link_is_refused_and_changes_nothing_outside(
    tmp_path, outside, entry
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / entry).symlink_to(outside / PLANTS[entry])
    before = snapshot(outside)
    out = cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={run_dir}")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text
    assert f"{run_dir / entry} is a symlink" in text and "nothing was written" in text
    assert snapshot(outside) == before
    # No run file and no lock; Hydra's job log (which logs the refusal) is the only new file.
    assert set(os.listdir(run_dir)) <= {entry, "slime_hydra.log"}
    assert (run_dir / entry).is_symlink()


def test_write_files_never_writes_through_a_planted_file_link(tmp_path, outside):
    (tmp_path / "config.yaml").symlink_to(outside / "config")
    before = snapshot(outside)
    write_files({tmp_path / "config.yaml": "a: 1\n", tmp_path / "schedule.json": "{}"}, tmp_path)
    assert snapshot(outside) == before  # the link itself was replaced, its target untouched
    assert not (tmp_path / "config.yaml").is_symlink()
    assert (tmp_path / "config.yaml").read_text() == "a: 1\n"
    assert sorted(os.listdir(tmp_path)) == ["config.yaml", "outside", "schedule.json"]


def test_a_file_under_a_linked_dir_is_refused(tmp_path, outside):
    (tmp_path / ".hydra").symlink_to(outside / "dir")
    with pytest.raises(SlimeHydraError, match=r"\.hydra is a symlink"):
        write_file(tmp_path / ".hydra" / "config.yaml", "a: 1\n", tmp_path)
    with pytest.raises(SlimeHydraError, match=r"\.hydra is a symlink"):
        open_append(tmp_path / ".hydra" / "log", tmp_path)
    assert not os.listdir(outside / "dir")
    check_inside(tmp_path / "ok" / "x", tmp_path)  # no link on the way: fine


def test_appending_never_follows_a_link(tmp_path, outside):
    (tmp_path / "metrics.jsonl").symlink_to(outside / "metrics")
    with pytest.raises(SlimeHydraError, match=r"metrics\.jsonl is a symlink"):
        open_append(tmp_path / "metrics.jsonl", tmp_path)
    assert (outside / "metrics").read_text() == "the user's metrics file\n"


def test_a_dir_written_whole_never_replaces_a_linked_dir(tmp_path, outside):
    """An HF export's dir planted as a link: refused, the link and its target as they were."""
    (tmp_path / "hf").symlink_to(outside / "dir")
    before = snapshot(outside)
    with pytest.raises(SlimeHydraError, match=r"/hf is a symlink"):
        write_dir(
            tmp_path / "hf", lambda stage: (stage / "model.safetensors").write_bytes(b"w"), tmp_path
        )
    assert snapshot(outside) == before and (tmp_path / "hf").is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["hf", "outside"]  # no staging dir left


def test_a_dir_written_whole_replaces_the_old_one_entirely(tmp_path):
    old = tmp_path / "hf"
    old.mkdir()
    (old / "model-00002-of-00002.safetensors").write_bytes(b"an earlier export's shard")
    write_dir(old, lambda stage: (stage / "model.safetensors").write_bytes(b"new"), tmp_path)
    assert os.listdir(old) == ["model.safetensors"]
    assert sorted(os.listdir(tmp_path)) == ["hf"]


SWEEP_PLANTS = {"multirun.yaml": "config", "sweep_jobs.jsonl": "metrics", "0_seed=1": "dir"}
"""What a sweep writes in its dir (Hydra's multirun.yaml, the jobs' lines, a job's dir)."""


@pytest.mark.integration
@pytest.mark.parametrize("entry", sorted(SWEEP_PLANTS))
def test_a_sweep_into_a_dir_with_a_planted_link_is_refused_before_any_job(tmp_path, outside, entry):
    """Hydra wrote multirun.yaml through a planted link, outside the sweep dir (rc 0)."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / entry).symlink_to(outside / SWEEP_PLANTS[entry])
    before = snapshot(outside)
    out = cli("-m", "trainer=plan", "logger=jsonl", "seed=1,2", f"hydra.sweep.dir={sweep}")
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    assert f"{sweep / entry} is a symlink" in text and "pass a new hydra.sweep.dir" in text
    assert snapshot(outside) == before
    assert os.listdir(sweep) == [entry]


# Entries a run creates, planted as the other kind (a file for a dir, a dir for a file).
OTHER_KIND = {
    ".hydra": ("file", "/.hydra is a file where a dir is needed: move the file away"),
    ".hydra/hydra.yaml": ("dir", "/.hydra/hydra.yaml is a directory, and the run writes its file"),
}


@pytest.mark.integration
@pytest.mark.parametrize("entry", sorted(OTHER_KIND))
def test_a_plan_into_a_dir_with_an_entry_of_the_other_kind_is_one_paragraph_and_writes_nothing(
    tmp_path, entry
):
    """A file at .hydra raised FileExistsError from mkdir; a dir at one of the run's files failed
    its rename after the files before it were in place."""
    run_dir = tmp_path / "run"
    kind, needle = OTHER_KIND[entry]
    if kind == "file":
        run_dir.mkdir()
        (run_dir / entry).write_text("the user's file\n")
    else:
        (run_dir / entry).mkdir(parents=True)
    before = snapshot(run_dir)
    out = cli("trainer=plan", "logger=jsonl", f"hydra.run.dir={run_dir}")
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "Traceback" not in text, text[-3000:]
    assert f"{run_dir}{needle}" in text and "pass a new hydra.run.dir" in text
    assert snapshot(run_dir).items() >= before.items()
    assert set(os.listdir(run_dir)) == {entry.split("/")[0], ".lock", "slime_hydra.log"}
    if kind == "dir":
        assert os.listdir(run_dir / ".hydra") == ["hydra.yaml"]
