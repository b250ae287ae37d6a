"""A rank the launcher stops: torchrun sends SIGTERM to the ranks left alive when one fails.
Rank 0 must still close its sinks, so that wandb's file holds every step it was given, also
when a second SIGTERM arrives while it closes (the signal is real; only its timing is staged)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.test_train_cpu import SMALL
from tests.wandb_reader import read_run, wandb_files

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

RANK0 = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from slime_hydra.log.sink import FanOut, RunInfo
    from slime_hydra.log.wandb import WandbSink
    from slime_hydra.train.run.stops import raise_on_stop
    from slime_hydra.train.run.worker import close_sink

    class SignalOnClose:
        '''Stages the launcher's SIGTERM at the worst moment: while the sinks close.'''
        def log(self, metrics): pass
        def close(self): os.kill(os.getpid(), signal.SIGTERM)

    raise_on_stop()
    sink = FanOut([SignalOnClose(), WandbSink(RunInfo(Path(sys.argv[1]), {}, "run", None, "cpu"))])
    try:
        for step in range(1, 4):
            sink.log({"step": step, "train/loss": 1.0 / step})
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher stops this rank mid-step
        time.sleep(60)
    finally:
        close_sink(sink)
    """
)


def test_a_stopped_rank_0_closes_wandb_with_every_step_it_logged(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    out = subprocess.run(
        [sys.executable, "-c", RANK0, str(tmp_path)],
        cwd=REPO,
        env={**env, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    # The rank still ends as stopped (the launcher sees a failure), not as a success.
    assert out.returncode == 1 and "Stopped: stopped by signal" in out.stderr, out.stderr
    assert out.returncode != -signal.SIGTERM
    (path,) = wandb_files(tmp_path)
    run = read_run(path)
    assert [row["step"] for row in run.history] == [1, 2, 3]
    # close() ran to its end: the run summary (written by close, 3 steps) and the exit record.
    assert run.summary["summary/steps"] == 3
    assert run.exited


def stop_when(line_part: str, sig: signal.Signals, *overrides: str) -> tuple[int, str]:
    """Run `python -m slime_hydra OVERRIDES`, send `sig` to it once a line containing
    `line_part` is printed, and return its exit code and all it printed."""
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", *overrides]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line_part in line:
            proc.send_signal(sig)
            break
    lines.append(proc.stdout.read())
    return proc.wait(timeout=300), "".join(lines)


def test_ctrl_c_while_planning_is_one_line_exit_130_and_writes_nothing(tmp_path: Path) -> None:
    # 10⁶ samples: planning takes seconds, so the signal lands inside it.
    code, text = stop_when(
        "Instantiating <slime_hydra.data.synthetic",
        signal.SIGINT,
        "trainer=plan",
        "logger=jsonl",
        "data.num_prompts=128000",
        f"hydra.run.dir={tmp_path}",
    )
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert f"stopped by SIGINT before training started: nothing was written to {tmp_path}" in text
    assert sorted(os.listdir(tmp_path)) == [".lock", "slime_hydra.log"]


def test_sigterm_while_training_is_one_line_exit_143_naming_the_resume(tmp_path: Path) -> None:
    code, text = stop_when(
        "Saved checkpoint after step 1",
        signal.SIGTERM,
        f"hydra.run.dir={tmp_path}",
        *SMALL,
        "trainer.save_interval=1",
    )
    assert code == 143, text[-3000:]
    assert "Traceback" not in text and "SignalException" not in text, text[-6000:]
    assert (
        f"stopped by SIGTERM: the run in {tmp_path} keeps its last checkpoint; continue it with "
        f"trainer.resume=true hydra.run.dir={tmp_path}"
    ) in text
    assert (tmp_path / "checkpoints/latest").read_text() == "1\n"


STOP_IN_LOGGING = textwrap.dedent(
    """
    import io, logging, os, signal
    from slime_hydra.errors import Stopped
    from slime_hydra.train.run.stops import raise_on_stop

    class SignalOnFlush(io.StringIO):
        '''The launcher's SIGTERM staged inside a log handler's flush (CI caught it there).'''
        def flush(self): os.kill(os.getpid(), signal.SIGTERM)

    log = logging.getLogger("rank")
    log.addHandler(logging.StreamHandler(SignalOnFlush()))
    raise_on_stop()
    try:
        log.warning("Saved checkpoint after step 1")
    except Stopped:
        raise SystemExit(7)
    raise SystemExit(0)
    """
)


def test_a_sigterm_inside_a_log_handler_still_stops_the_rank() -> None:
    # logging's handlers report and swallow any Exception raised in emit: the stop must not be one.
    out = subprocess.run(
        [sys.executable, "-c", STOP_IN_LOGGING], cwd=REPO, capture_output=True, text=True
    )
    assert out.returncode == 7, out.stderr
    assert "Logging error" not in out.stderr


def test_ctrl_c_in_a_plan_run_says_what_it_logged_and_that_it_cannot_resume(tmp_path: Path):
    """A plan run saves no checkpoint: the line said 'keeps its last checkpoint; continue it with
    trainer.resume=true', which plan mode does not even accept."""
    code, text = stop_when(
        "step  mbs",
        signal.SIGINT,
        "trainer=plan",
        "logger=jsonl",
        "data.num_prompts=20000",
        f"hydra.run.dir={tmp_path}",
    )
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    logged = len((tmp_path / "metrics.jsonl").read_text().splitlines())
    assert (
        f"stopped by SIGINT: the run in {tmp_path} logged {logged} step(s) to metrics.jsonl and "
        "saved no checkpoint"
    ) in text
    assert "so it cannot be resumed: rerun it with a new hydra.run.dir." in text
    assert "trainer.resume=true" not in text


def children_of(pid: int) -> list[int]:
    """The pids of the processes whose parent is `pid`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(proc.name))
    return found


def ctrl_c_when(line_part: str, run_dir: Path, *command: str) -> tuple[int, str]:
    """Run `python -m COMMAND` (default: a small training run) in a session of its own, as a
    terminal runs it, and press Ctrl-C (SIGINT to the whole foreground group) once a line
    containing `line_part` is printed and the job process has started its two workers; return
    its exit code and all it printed."""
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    run = ["slime_hydra", f"hydra.run.dir={run_dir}", *SMALL, "model.num_layers=4"]
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-m", *(command or run)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line_part in line:
            while len(children_of(proc.pid)) < 2 and proc.poll() is None:
                time.sleep(0.05)
            time.sleep(0.5)  # inside the workers' startup: importing torch takes seconds
            os.killpg(proc.pid, signal.SIGINT)
            break
    lines.append(proc.stdout.read())
    return proc.wait(timeout=300), "".join(lines)


@pytest.mark.parametrize(
    "when, line",
    [
        # The workers are starting (importing torch): a KeyboardInterrupt traceback there came
        # from each worker's own startup, before any of our code ran in it.
        ("Launching", "stopped by SIGINT before training started: nothing was written to"),
        # The workers are training: the stop, then the launcher's own SIGINT after it.
        ("step 1/", "stopped by SIGINT: the run in"),
    ],
)
def test_ctrl_c_while_workers_start_or_train_is_one_line_without_a_traceback(
    tmp_path: Path, when: str, line: str
) -> None:
    code, text = ctrl_c_when(when, tmp_path / "run")
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-6000:]
    assert "death signal" not in text, text[-3000:]  # the launcher's warning: the line says it
    assert line in text, text[-3000:]


def test_ctrl_c_while_the_calibration_workers_start_is_one_line_and_writes_no_file(
    tmp_path: Path,
) -> None:
    out = tmp_path / "cal.json"
    calibrate = ["slime_hydra.calibrate", "--out", str(out), "--max-tokens", "512"]
    code, text = ctrl_c_when("Launching", tmp_path, *calibrate, f"hydra.run.dir={tmp_path}")
    assert code == 130, text[-3000:]
    assert "Traceback" not in text and "SignalException" not in text, text[-6000:]
    assert "calibration stopped by SIGINT: no calibration file was written." in text
    assert not out.exists()


def workers_of(job_pid: int) -> list[int]:
    """The pids of the worker processes the job process `job_pid` started (their command line
    names train/run/worker_process.py and the job's pid)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"worker_process" in arg for arg in argv) and str(job_pid).encode() in argv:
            found.append(int(proc.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_job_leaves_no_worker_behind(tmp_path: Path) -> None:
    # The workers run in a session of their own (Ctrl-C reaches the job process only), so
    # nothing else would stop them once the job process is gone.
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", f"hydra.run.dir={tmp_path}"]
    slow = ["data.num_prompts=64", "batching.global_batch_size=8", "model.num_layers=4"]
    proc = subprocess.Popen(
        [*cmd, *SMALL, *slow],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        stderr=subprocess.STDOUT,
    )
    for line in proc.stdout:
        if "step 1/" in line:
            break
    workers = workers_of(proc.pid)
    assert len(workers) == 2
    proc.kill()
    proc.wait(timeout=60)
    for _ in range(300):  # SIGTERM from the kernel, then the worker's own teardown
        if not workers_of(proc.pid):
            break
        time.sleep(0.1)
    assert not workers_of(proc.pid)
