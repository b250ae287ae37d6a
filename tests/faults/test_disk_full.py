"""A full disk: the run files are written as one set or not at all, no temporary file is left,
and the error says the disk is full, where, and the bytes needed. A real small tmpfs where
this process may mount one (root), and an ENOSPC injected at the one write function always."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from slime_hydra import files
from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import write_dir, write_files
from tests.hf_models import make_checkpoint

REPO = Path(__file__).resolve().parents[2]
HF_WORKER = REPO / "tests/integration/_hf_worker.py"
FREE_KB = 12
"""Room left on the tmpfs: the lock, the log and config.yaml fit, schedule.json does not."""


@contextmanager
def tmpfs(at: Path, size_kb: int, free_kb: int | None = None) -> Iterator[Path]:
    """A tmpfs of `size_kb` KiB mounted at `at`, with `free_kb` left free by a filler file
    (None: all of it); skips the test where mount is denied."""
    at.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(at)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        if free_kb is not None:
            (at / "filler").write_bytes(b"\0" * (size_kb - free_kb) * 1024)
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=True)


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 48 KiB tmpfs with FREE_KB left free."""
    with tmpfs(tmp_path / "mnt", 48, FREE_KB) as mnt:
        yield mnt


@pytest.mark.integration
def test_a_full_disk_leaves_no_half_written_run_and_says_so(full_disk: Path) -> None:
    run_dir = full_disk / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", "trainer=plan", "logger=jsonl"]
    out = subprocess.run(
        [*cmd, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, capture_output=True, text=True
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "Logging error" not in text
    assert f"no space left on the device of {run_dir}/schedule.json (" in text
    assert "bytes needed" in text
    # Neither config.yaml nor schedule.json nor a temporary file nor .hydra: as before the run.
    assert sorted(os.listdir(run_dir)) == [".lock", "slime_hydra.log"]
    assert (run_dir / ".lock").read_bytes() == b""
    (full_disk / "filler").unlink()  # space again: the same dir takes the run
    again = subprocess.run(
        [*cmd, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert {"config.yaml", "schedule.json", "metrics.jsonl"} <= set(os.listdir(run_dir))


def test_an_injected_enospc_in_the_second_file_keeps_neither(tmp_path, monkeypatch) -> None:
    real = files._write_one
    calls = []

    def fill_up(fd: int, content: files.Content) -> int:
        calls.append(content)
        if len(calls) == 2:
            os.close(fd)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, content)

    monkeypatch.setattr(files, "_write_one", fill_up)
    (tmp_path / "config.yaml").write_text("old: run\n")
    with pytest.raises(SlimeHydraError) as err:
        write_files(
            {tmp_path / "config.yaml": "a: 1\n", tmp_path / "schedule.json": "{}"}, tmp_path
        )
    assert str(err.value).startswith(
        f"no space left on the device of {tmp_path / 'schedule.json'} (2 bytes needed)"
    )
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]  # no temporary file left
    assert (tmp_path / "config.yaml").read_text() == "old: run\n"  # the old file, not half a set


def test_enospc_wrapped_by_torch_save_is_a_full_disk(tmp_path, monkeypatch) -> None:
    def save(f) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from (
            OSError(errno.ENOSPC, "No space left on device")
        )

    with pytest.raises(SlimeHydraError, match="no space left on the device of"):
        files.write_file(tmp_path / "rank_000.pt", save, tmp_path)
    assert os.listdir(tmp_path) == []


def test_a_dir_written_whole_on_a_full_disk_keeps_the_old_one(full_disk: Path) -> None:
    old = full_disk / "hf"
    old.mkdir()
    (old / "model.safetensors").write_bytes(b"the previous export")

    def fill(stage: Path) -> None:
        (stage / "model.safetensors").write_bytes(b"\1" * (FREE_KB + 4) * 1024)

    with pytest.raises(SlimeHydraError) as err:
        write_dir(old, fill, full_disk)
    assert str(err.value).startswith(f"no space left on the device of {old}: nothing of this")
    assert sorted(os.listdir(full_disk)) == ["filler", "hf"]  # no staging dir left
    assert (old / "model.safetensors").read_bytes() == b"the previous export"


@pytest.mark.integration
def test_an_hf_export_on_a_full_disk_keeps_the_previous_export_and_says_so(
    tmp_path: Path,
) -> None:
    """The real export (mbridge, safetensors) of a tiny Qwen2 model onto a tmpfs with room for
    the worker's logits (45 KB) and not for the weights (382 KB)."""
    ckpt = make_checkpoint(tmp_path / "qwen", tied=True)
    with tmpfs(tmp_path / "mnt", 1024, 128) as mnt:
        out = mnt / "out"
        (out / "export_0").mkdir(parents=True)
        (out / "export_0" / "model.safetensors").write_bytes(b"the previous export")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node=1", str(HF_WORKER), str(out), "1", "1", "1", "1", "load"]
        proc = subprocess.run(
            [*cmd, str(ckpt)], env=env, capture_output=True, text=True, timeout=600
        )
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0, text[-4000:]
        assert f"no space left on the device of {out / 'export_0'}: nothing of this" in text
        assert sorted(os.listdir(out)) == ["export_0", "logits_0.pt"]  # no staging dir left
        assert os.listdir(out / "export_0") == ["model.safetensors"]
        assert (out / "export_0" / "model.safetensors").read_bytes() == b"the previous export"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An empty 64 KiB tmpfs."""
    with tmpfs(tmp_path / "small", 64) as mnt:
        yield mnt


def plan(*overrides: str, stdout: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A plan run from the CLI; with `stdout`, its standard output goes to that file."""
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", "trainer=plan", *overrides]
    if stdout is None:
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    with stdout.open("w") as out:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.PIPE)
    return subprocess.CompletedProcess(cmd, proc.returncode, "", proc.stderr.decode())


MANY_STEPS = ("batching.global_batch_size=8", "data.num_prompts=64")
"""64 steps: their metrics rows (~45 KB) overflow the small disk after the run's other files."""


@pytest.mark.integration
def test_metrics_on_a_full_disk_keep_whole_rows_and_say_so(small_disk: Path) -> None:
    """metrics.jsonl filled the disk mid-row: a traceback, and a torn line that ended the file."""
    run_dir = small_disk / "run"
    out = plan("logger=jsonl", *MANY_STEPS, f"hydra.run.dir={run_dir}")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "Logging error" not in text, text[-3000:]
    assert f"no space left on the device of {run_dir / 'metrics.jsonl'} (" in text
    data = (run_dir / "metrics.jsonl").read_bytes()
    assert data.endswith(b"\n")
    rows = [json.loads(line) for line in data.splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1)) and 0 < len(rows) < 64


@pytest.mark.integration
def test_the_job_log_on_a_full_disk_is_one_line(full_disk: Path) -> None:
    """Room for the lock and a few log records only: logging printed a traceback per record."""
    (full_disk / "filler2").write_bytes(b"\0" * (FREE_KB - 4) * 1024)
    run_dir = full_disk / "run"
    out = plan("logger=jsonl", f"hydra.run.dir={run_dir}")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "Traceback" not in text and "Logging error" not in text, text[-3000:]
    assert text.count(f"no space left on the device of {run_dir / 'slime_hydra.log'}: ") == 1


@pytest.mark.integration
def test_stdout_on_a_full_disk_stops_the_table_not_the_run(small_disk: Path, tmp_path) -> None:
    """The console table redirected to a full disk: print raised, a traceback ended the run."""
    run_dir = tmp_path / "run"
    (small_disk / "filler").write_bytes(b"\0" * 48 * 1024)  # 16 KiB left: a third of the table
    out = plan(
        "logger=console",
        "batching.global_batch_size=8",
        "data.num_prompts=512",
        f"hydra.run.dir={run_dir}",
        stdout=small_disk / "out.txt",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Logging error" not in out.stderr, out.stderr[-3000:]
    assert (
        out.stderr.count(f"no space left on the device of {small_disk / 'out.txt'} (stdout)") == 1
    )
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 512


@pytest.mark.integration
def test_wandb_on_a_full_disk_is_one_warning_and_the_run_goes_on(small_disk: Path) -> None:
    """wandb's media and its own debug log filled the disk: logging printed tracebacks."""
    run_dir = small_disk / "run"
    out = plan("logger=wandb", f"hydra.run.dir={run_dir}")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "Logging error" not in text, text[-3000:]
    assert f"no space left on the device of {run_dir / 'wandb'}: wandb could not " in text
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
