"""What the app calls with the trainer's settings and the planned job: `check` before the run
dir is written, then `start`, which goes one way down: trainer=plan simulates in this process
(plan.run_plan); trainer=cpu|gpu trains (launch.launch → worker.train).

Torch is imported only when training starts, so composing configs and `trainer=plan` stay light.
"""

from __future__ import annotations

from slime_hydra.train.job import Job
from slime_hydra.train.run.checks import check_training
from slime_hydra.train.run.plan import check_plan, run_plan
from slime_hydra.train.settings import PlanTrainer, Trainer


def check(trainer: Trainer, job: Job) -> None:
    """Everything that can be checked before the run dir is written and any worker starts."""
    if isinstance(trainer, PlanTrainer):
        check_plan(trainer)
    else:
        check_training(trainer, job)


def start(trainer: Trainer, job: Job) -> float | None:
    """Run the checked job: plan mode's objective (the simulated seconds), or None after
    training."""
    if isinstance(trainer, PlanTrainer):
        return run_plan(trainer, job)
    from slime_hydra.train.run.launch import launch

    launch(trainer, job)
    return None
