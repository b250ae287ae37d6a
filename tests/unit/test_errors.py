"""The signal each stop stands for, as the app, the calibration and the report exit with it."""

from __future__ import annotations

import signal

from torch.distributed.elastic.multiprocessing.api import SignalException

from slime_hydra.errors import SlimeHydraError, Stopped, stop_signal


def test_each_stop_names_its_signal_and_nothing_else_is_a_stop() -> None:
    assert stop_signal(KeyboardInterrupt()) == 2
    assert stop_signal(Stopped(signal.SIGTERM)) == 15
    assert stop_signal(SignalException("got signal: 1", sigval=signal.SIGHUP)) == 1
    assert stop_signal(SlimeHydraError("bad value")) is None
    assert stop_signal(SystemExit(1)) is None


def test_a_stop_says_which_signal_it_was() -> None:
    stop = Stopped(signal.SIGINT)
    assert (str(stop), stop.name) == ("stopped by signal 2 (SIGINT)", "SIGINT")
