"""How a worker stops: the launcher's SIGTERM (a peer failed, or the run was cancelled), or the
signal the job process got (a Ctrl-C reaches only the job process, whose launcher passes it on
to the workers; under torchrun, every rank gets it)."""

from __future__ import annotations

import os
import signal

from slime_hydra.errors import Stopped

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def raise_on_stop() -> None:
    """The first SIGINT or SIGTERM raises Stopped where the rank is, so its `finally` blocks run
    (rank 0 closes its sinks, and wandb writes out the steps it holds); those after it are
    ignored while the rank winds down, where another raise would cut its teardown short (the
    launcher kills a rank still alive 30 s after its stop)."""

    def stop(signum: int, _frame: object) -> None:
        ignore_stops()
        raise Stopped(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)


def exit_on_stop() -> None:
    """Until `raise_on_stop`: SIGINT or SIGTERM ends the process at once, exit 1. A worker still
    starting (reading its arguments, importing torch and megatron) has nothing to close, and a
    stop raised there can land where Python ignores exceptions (an import lock's weakref
    callback: "Exception ignored in ..."), and the worker would run on until the launcher kills
    it, 30 s later."""

    def stop(_signum: int, _frame: object) -> None:
        os._exit(1)

    for signum in STOP_SIGNALS:
        signal.signal(signum, stop)


def ignore_stops() -> None:
    """SIGINT and SIGTERM ignored from here on (SIGKILL still ends the rank)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
