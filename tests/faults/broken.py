"""A logger that fails as third-party code does (not with our error), and a Hydra callback that
signals its process inside Hydra's job setup, for sweep fault tests."""

from __future__ import annotations

import os
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from slime_hydra.log.sink import Metrics, RunInfo
from slime_hydra.schedule import Schedule


class BrokenSink:
    """Raises RuntimeError when built for a run whose seed is 2; logs nothing otherwise."""

    def __init__(self, run: RunInfo, schedule: Schedule | None = None) -> None:
        if run.config.get("seed") == 2:
            raise RuntimeError("the logger's service is down")

    def log(self, metrics: Metrics) -> None:
        """Drop the row."""

    def close(self) -> None:
        """Nothing to close."""


class SignalInSetup(Callback):
    """A Hydra callback that sends its own process `signum` as Hydra sets job `num` up (before
    the job's task runs): a Ctrl-C or a kill that arrives inside Hydra's own code."""

    def __init__(self, num: int, signum: int) -> None:
        self.num, self.signum = num, signum

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Signal this process for job `num`."""
        if config.hydra.job.num == self.num:
            os.kill(os.getpid(), self.signum)
