"""How a worker stops: the launcher's SIGTERM (a peer failed, or the run was cancelled), or the
terminal's Ctrl-C, which reaches every process of the foreground group, each worker as well as
the job process, whose launcher then sends its own stop after it."""

from __future__ import annotations

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


def ignore_stops() -> None:
    """SIGINT and SIGTERM ignored from here on (SIGKILL still ends the rank)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
