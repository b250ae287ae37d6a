"""A worker process as the launcher starts it (`python -c WORKER_PROGRAM ARGS`, train/run/
launch.py): from its first line, before torch is imported, SIGINT or SIGTERM ends it at once
with exit 1 and no traceback, until its rank starts (worker.rank_process), from where they
raise the stop; the worker dies with the job process that started it; then run_worker hands the
job to its entry (worker.train, or the calibration's measure). It imports nothing of the
launcher: the job goes one way, launch → worker process → entry."""

from __future__ import annotations

import ctypes
import importlib
import os
import pickle
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

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


def run_worker(arguments: str) -> None:
    """What each worker runs once its stop is set: its rank's output (train/run/rank_output.py,
    given the warnings the job process showed), then the trainer and job unpickled from the
    `arguments` file (launch.start_workers writes it) and handed to the entry
    ("module:function"). Unpickling the job imports torch and megatron (the iterator), so they
    come second, and the entry is imported here: megatron's import-time warnings then meet this
    rank's filters. A stopped rank exits 1 without a traceback: its error file holds the stop
    (the entry records it)."""
    from slime_hydra.train.run.rank_output import setup_rank_output

    with open(arguments, "rb") as source:
        log_file, shown, entry = pickle.load(source)
        setup_rank_output(int(os.environ["RANK"]), Path(log_file), shown)
        trainer, job = pickle.load(source)
    module, function = entry.split(":")
    getattr(importlib.import_module(module), function)(trainer, job)


def main(argv: Sequence[str]) -> int:
    """`argv`: the job process's pid and the file of the worker's arguments (launch.py). A
    failure is recorded in the rank's error file, where the launcher reads it to name the rank
    and its error (launch.failure_report), and ends the worker with exit 1: its traceback is
    the launcher's to show."""
    exit_on_stop()
    try:
        die_with_parent(int(argv[0]))
        run_worker(argv[1])
    except Stopped:
        return 1
    except Exception as exc:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        get_error_handler().record_exception(exc)
        return 1
    return 0
