"""The one error type a user sees: what is wrong, with which value, and which override fixes it;
and the stop a signal raises where a process is."""

from __future__ import annotations

import signal


class SlimeHydraError(ValueError):
    """A problem with the user's input or config; printed as one paragraph, without a traceback."""


class Stopped(BaseException):
    """SIGINT or SIGTERM, raised by a handler where the process is: a BaseException, as
    KeyboardInterrupt is, so that code catching `Exception` (a logging handler's flush reports
    and swallows it) cannot lose the stop."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum} ({signal.Signals(signum).name})")
        self.signum = signum

    @property
    def name(self) -> str:
        """The signal's name: SIGINT, SIGTERM."""
        return signal.Signals(self.signum).name


def raise_stopped(signum: int, _frame: object) -> None:
    """A SIGINT/SIGTERM handler: raise Stopped where the process is."""
    raise Stopped(signum)


def stop_signal(exc: BaseException) -> int | None:
    """The signal that `exc` stands for: SIGINT for KeyboardInterrupt, a Stopped's own, or that
    of torch's elastic launcher (its SignalException carries `sigval`); None for any other."""
    if isinstance(exc, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(exc, Stopped):
        return exc.signum
    sigval = getattr(exc, "sigval", None)
    return None if sigval is None else int(sigval)
