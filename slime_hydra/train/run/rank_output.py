"""What each process of a run prints: rank 0 (the job process, then rank 0's worker) logs its
progress to the console and the run dir's log and shows each third-party warning once; the
other ranks show only our own warnings and every error, so N ranks print what one would."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path

from slime_hydra.files import NoFollowFileHandler

OURS = "slime_hydra"
"""The logger every module of ours logs under (`logging.getLogger(__name__)`)."""

_shown: set[str] = set()


def shown_warnings() -> frozenset[str]:
    """The warnings this process has shown, for the workers it starts not to repeat them."""
    return frozenset(_shown)


def show_once(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning`: each warning text once per run, as one log record. (Python's
    "once" filter forgets what it showed whenever an import adds a filter, as torch's do.)"""
    del file, line
    text = f"{category.__name__}: {str(message).strip()}"
    if text in _shown:
        return
    _shown.add(text)
    logging.getLogger("py.warnings").warning("%s (%s:%d)", text, filename, lineno)


def setup_rank_output(rank: int, log_file: Path | None = None, shown: Iterable[str] = ()) -> None:
    """Logging and warning handling for this rank, set before megatron is imported so that its
    import-time warnings pass through it. A process the launcher spawned (no handlers yet) logs
    to stderr and, on rank 0, appends to `log_file`; where Hydra set up logging its handlers
    stay. `shown`: warnings the job process showed already. Python's -W options, when given,
    decide which warnings show."""
    root = logging.getLogger()
    if not root.handlers:
        fmt = f"[%(asctime)s][rank {rank}][%(name)s][%(levelname)s] - %(message)s"
        logging.basicConfig(format=fmt)
        if rank == 0 and log_file is not None:
            handler = NoFollowFileHandler(log_file)
            handler.setFormatter(logging.Formatter(fmt))
            root.addHandler(handler)
    logging.getLogger("megatron").setLevel(logging.WARNING)  # its set-up chatter: DDP config…
    if rank == 0:
        root.setLevel(logging.INFO)
    else:  # third-party warnings and chatter are rank 0's to show; errors show everywhere
        root.setLevel(logging.ERROR)
        logging.getLogger(OURS).setLevel(logging.WARNING)
    _shown.update(shown)
    warnings.showwarning = show_once
    if not sys.warnoptions:
        warnings.simplefilter("default" if rank == 0 else "ignore")
