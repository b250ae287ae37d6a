"""A worker process as the launcher starts it (`python -c WORKER_PROGRAM ARGS`, train/run/
launch.py): from its first line, before torch is imported, SIGINT or SIGTERM ends it at once
with exit 1 and no traceback, until its rank starts (worker.rank_process), from where they
raise the stop; the worker dies with the job process that started it; then launch.run_worker."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

from slime_hydra.errors import Stopped
from slime_hydra.train.run.stops import exit_on_stop

PR_SET_PDEATHSIG = 1
"""prctl(2): the signal this process gets when the thread that started it ends (Linux)."""


def die_with_parent(parent: int) -> None:
    """SIGTERM when the job process `parent` ends (a SIGKILLed job leaves no worker training on:
    the workers run in a session of their own), and at once where it ended already."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: Sequence[str]) -> int:
    """`argv`: the job process's pid and the file of the worker's arguments (launch.py). A
    failure is recorded in the rank's error file, where the launcher reads it to name the rank
    and its error (launch.failure_report), and ends the worker with exit 1: its traceback is
    the launcher's to show."""
    exit_on_stop()
    try:
        die_with_parent(int(argv[0]))
        from slime_hydra.train.run.launch import run_worker  # imports torch: after the stop

        run_worker(argv[1])
    except Stopped:
        return 1
    except Exception as exc:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exc)
        return 1
    return 0
