"""A rank the launcher stops: torchrun sends SIGTERM to the ranks left alive when one fails.
Rank 0 must still close its sinks, so that wandb's file holds every step it was given, also
when a second SIGTERM arrives while it closes (the signal is real; only its timing is staged)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.wandb_reader import read_run, wandb_files

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration

RANK0 = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    from slime_hydra.log.sink import FanOut, RunInfo
    from slime_hydra.log.wandb import WandbSink
    from slime_hydra.train.worker import close_sink, raise_on_sigterm

    class SignalOnClose:
        '''Stages the launcher's SIGTERM at the worst moment: while the sinks close.'''
        def log(self, metrics): pass
        def close(self): os.kill(os.getpid(), signal.SIGTERM)

    raise_on_sigterm()
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
