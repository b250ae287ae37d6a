"""Opening a run's sinks: metrics.jsonl (always) and the `logger` group's choice (its factory,
instantiated partially by the app), so that the trainers that log (plan mode in the app's
process, rank 0's worker) need nothing from the config."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from slime_hydra.log.console import ConsoleSink
from slime_hydra.log.jsonl import JsonlSink
from slime_hydra.log.sink import FanOut, RunInfo, Sink

if TYPE_CHECKING:
    from slime_hydra.schedule import Schedule


def open_sinks(
    logger: Callable[..., Sink],
    run: RunInfo,
    schedule: Schedule | None = None,
    steps_done: int = 0,
    table: bool = False,
) -> FanOut:
    """metrics.jsonl in the run dir (its rows of the `steps_done` steps before this run kept),
    then the `logger` group's sink, built with the run and the schedule it logs (a sink such as
    wandb's draws each step's micro-batches from it); with `table`, the console table too,
    whatever the logger (once, when the logger is the console)."""
    sinks = [
        JsonlSink(run.run_dir / "metrics.jsonl", steps_done),
        logger(run=run, schedule=schedule),
    ]
    if table and not isinstance(sinks[-1], ConsoleSink):
        sinks.append(ConsoleSink(run))
    return FanOut(sinks)
