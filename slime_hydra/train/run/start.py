"""What the app calls with the trainer's settings and the planned job: `check` before the run
dir is written, then `start`, which goes one way down: trainer=plan simulates in this process;
trainer=cpu|gpu trains in torchrun's workers (worker.train) or in workers the elastic launcher
starts here (launch.launch → worker.train).

Torch is imported only when training starts, so composing configs and `trainer=plan` stay light.
"""

from __future__ import annotations

import dataclasses
import logging

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import synthesize_tokens
from slime_hydra.train.job import Job
from slime_hydra.train.run.checks import check_training
from slime_hydra.train.run.plan import check_plan, run_plan
from slime_hydra.train.run.torchrun import torchrun_env
from slime_hydra.train.settings import PlanTrainer, Trainer

log = logging.getLogger(__name__)


def check(trainer: Trainer, job: Job) -> None:
    """Everything that can be checked before the run dir is written and any worker starts."""
    if isinstance(trainer, PlanTrainer):
        check_plan(trainer)
    else:
        check_training(trainer, job)


def start(trainer: Trainer, job: Job) -> float | None:
    """Run the checked job: plan mode's objective (the simulated seconds), or None after
    training, with the rollout given tokens first."""
    if isinstance(trainer, PlanTrainer):
        return run_plan(trainer, job)
    job = dataclasses.replace(
        job,
        rollout=with_tokens(job.rollout, job.dims.vocab_size, job.seed),
    )
    if torchrun_env() is not None:
        from slime_hydra.train.run.worker import train

        train(trainer, job)
    else:
        from slime_hydra.train.run.launch import launch

        launch(trainer, job)
    return None


def with_tokens(rollout: RolloutBatch, vocab_size: int, seed: int) -> RolloutBatch:
    """The rollout when it has tokens, else its lengths filled with the synthetic copy task."""
    if rollout.tokens is not None:
        return rollout
    log.info("The rollout has lengths only: synthesizing copy-task tokens (vocab %d)", vocab_size)
    tokens = synthesize_tokens(
        rollout.total_lengths, rollout.response_lengths, rollout.group_ids, vocab_size, seed
    )
    return dataclasses.replace(rollout, tokens=tokens)
