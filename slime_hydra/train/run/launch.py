"""Where training runs: in this process when torchrun started it as a worker, else in workers
started from inside the Hydra job through torch's elastic launcher (torchrun's machinery):
`trainer.nproc_per_node` processes on each node of the job (train/run/nodes.py)."""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from slime_hydra.errors import SlimeHydraError
from slime_hydra.rundir import LOG_FILE
from slime_hydra.train.job import Job
from slime_hydra.train.run.nodes import job_nodes, num_procs
from slime_hydra.train.run.rank_output import shown_warnings
from slime_hydra.train.run.torchrun import torchrun_env
from slime_hydra.train.settings import CpuTrainer

log = logging.getLogger(__name__)

BRIEF_CHARS = 160
"""The most of each other rank's message a failure report quotes."""


TRAIN = "slime_hydra.train.run.worker:train"
"""The workers' entry point of a training run."""


def launch(trainer: CpuTrainer, job: Job) -> None:
    """Train the job: the workers start here, or this process is one (torchrun started it)."""
    if torchrun_env() is None:
        start_workers(trainer, job, TRAIN)
        return
    from slime_hydra.train.run.worker import train

    train(trainer, job)


WORKER_PROGRAM = (
    "import os, sys; sys.path[:] = sys.argv[1].split(os.pathsep); "
    "from slime_hydra.train.run.worker_process import main; sys.exit(main(sys.argv[2:]))"
)
"""What each worker process runs (`python -c`), with the job process's sys.path, as
multiprocessing's spawn gives its children: train/run/worker_process.py."""


def start_workers(trainer: CpuTrainer, job: Job, entry: str) -> None:
    """Run `entry(trainer, job)` ("module:function": TRAIN, or the calibration's) in
    nproc_per_node worker processes (train/run/worker_process.py, which hands the pickled
    arguments to the entry); restart them up to max_restarts. Each worker runs in a session of
    its own, as torchrun's do: a Ctrl-C reaches this process only, and the launcher stops the
    workers with the same signal."""
    nodes = job_nodes()
    procs = num_procs(trainer, job)
    logs = tempfile.mkdtemp(prefix="slime_hydra_workers_")
    config = LaunchConfig(
        min_nodes=nodes.count,
        max_nodes=nodes.count,
        nproc_per_node=procs,
        run_id=nodes.run_id,
        rdzv_backend="c10d",
        rdzv_endpoint=nodes.endpoint,
        max_restarts=trainer.max_restarts,
        monitor_interval=0.2,
        logs_specs=DefaultLogsSpecs(log_dir=logs),
    )
    log.info(
        "Launching %d %s workers on node %d of %d (rendezvous %s, max_restarts=%d)",
        procs,
        trainer.backend,
        nodes.rank,
        nodes.count,
        nodes.endpoint,
        trainer.max_restarts,
    )
    # The agent logs each failed worker's traceback; the report below names the rank where the
    # failure happened with its error instead (and the traceback, when it is not ours).
    agent_log = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    level = agent_log.level
    agent_log.setLevel(logging.CRITICAL)
    # The job's own line says the run was stopped, and how to go on.
    server_log = logging.getLogger("torch.distributed.elastic.agent.server.api")
    server_log.addFilter(not_the_stop)
    try:
        arguments = Path(logs) / "worker.pickle"  # in a dir only this user can read
        with arguments.open("wb") as out:
            pickle.dump((str(job.run.run_dir / LOG_FILE), shown_warnings(), entry), out)
            pickle.dump((trainer, job), out)
        flags = [f"-W{option}" for option in sys.warnoptions]
        paths = os.pathsep.join(sys.path)
        command = [*flags, "-c", WORKER_PROGRAM, paths, str(os.getpid()), str(arguments)]
        elastic_launch(config, sys.executable)(*command)
    except ChildFailedError as exc:
        first = nodes.rank * procs
        failures = {**recorded_failures(Path(logs), first), **exc.failures}
        rank = root_cause(failures)
        if not failure_text(failures[rank]).startswith(SlimeHydraError.__name__ + ":"):
            log.error("rank %d's traceback:\n%s", rank, traceback_of(failures[rank]))
        raise SlimeHydraError(failure_report(failures)) from None
    finally:
        agent_log.setLevel(level)
        server_log.removeFilter(not_the_stop)
        shutil.rmtree(logs, ignore_errors=True)


def not_the_stop(record: logging.LogRecord) -> bool:
    """Whether a record of the elastic agent is other than its warning on a stop signal
    ("Received SIGINT death signal, shutting down workers")."""
    return not str(record.msg).startswith("Received %s death signal")


def recorded_failures(logs: Path, first_rank: int) -> dict[int, ProcessFailure]:
    """Every local worker's recorded error of the last attempt, by global rank. The launcher
    reports only the workers it saw exit first; a rank still tearing down after its own error
    (while its peers already failed on the lost connection) is stopped, not reported."""
    attempts = sorted(logs.glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    if not attempts:
        return {}
    return {
        first_rank + int(path.parent.name): ProcessFailure(
            local_rank=int(path.parent.name), pid=0, exitcode=1, error_file=str(path)
        )
        for path in attempts[-1].glob("*/error.json")
    }


def traceback_of(failure: ProcessFailure) -> str:
    """The traceback a worker recorded in its error file, if any."""
    message = failure.error_file_data.get("message")
    if isinstance(message, dict):
        return str(message.get("extraInfo", {}).get("py_callstack", "")).strip() or "(none)"
    return "(none recorded)"


PEER_LOST = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "socket timeout",
    "timed out",
    "nccl",
    "gloo",
    "processgroup",
    "signal 15",
    "signal 2",
    "signal 9",
    "sigterm",
    "sigint",
    "sigkill",
)
"""What a rank reports when another rank died first (a broken collective, or the launcher
stopping the survivors): never the root cause while a rank has a failure of its own."""


def failure_text(failure: ProcessFailure) -> str:
    """The failure's one-line message: the exception a worker recorded (`Type: message`), else
    what the launcher says (signal, exit code)."""
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "").strip()
    if not text or text.startswith("To enable traceback"):
        text = f"exited with code {failure.exitcode} without an error message"
    return text


def root_cause(failures: Mapping[int, ProcessFailure]) -> int:
    """The rank whose failure caused the others: one that raised our own error, else one whose
    error is not a lost peer, else the first observed."""

    def rank_key(item: tuple[int, ProcessFailure]) -> tuple[int, int, int]:
        rank, failure = item
        text = failure_text(failure)
        ours = text.startswith(SlimeHydraError.__name__ + ":")
        peer = any(needle in text.lower() for needle in PEER_LOST) or failure.exitcode < 0
        return (0 if ours else 1 if not peer else 2, failure.timestamp, rank)

    return min(failures.items(), key=rank_key)[0]


SOURCE_PLACE = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*")
"""Where in torch's C++ sources an error was raised (`[/__w/.../pair.cc:553] `): not for users."""


def brief(text: str, limit: int = BRIEF_CHARS) -> str:
    """A peer's message in a few words: its first line without C++ source places, cut at the
    last sentence that fits (else at a word, marked …), without a closing period."""
    line = SOURCE_PLACE.sub("", (text.splitlines() or [""])[0]).strip()
    if len(line) > limit:
        cut = line[: limit + 1]
        end = cut.rfind(". ")
        line = cut[: end + 1] if end > limit // 3 else cut[: cut.rfind(" ")].rstrip(",;:") + " …"
    return line.rstrip(". ")


def failure_report(failures: Mapping[int, ProcessFailure]) -> str:
    """One paragraph: the root-cause rank and its error, then what the other ranks reported."""
    rank = root_cause(failures)
    failure = failures[rank]
    text = failure_text(failure)
    ours = SlimeHydraError.__name__ + ": "
    text = text[len(ours) :] if text.startswith(ours) else text
    lines = text.splitlines() or [""]
    summary = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    others = [
        f"rank {r}: {brief(failure_text(f))}" for r, f in sorted(failures.items()) if r != rank
    ]
    also = f" Then: {'; '.join(others)}." if others else ""
    return f"training failed on rank {rank} (exit code {failure.exitcode}): {summary}{also}"
