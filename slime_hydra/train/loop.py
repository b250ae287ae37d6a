"""The step loop every rank runs: fault injection, one engine step per scheduled step,
metrics and a progress line on rank 0, checkpoints on the save interval and at the end."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import torch.distributed as dist
from megatron.core import parallel_state

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.log.sink import Sink
from slime_hydra.train import checkpoint
from slime_hydra.train.engine import Engine
from slime_hydra.train.job import Job
from slime_hydra.train.torchrun import TorchrunEnv

if TYPE_CHECKING:
    from slime_hydra.train.trainer import CpuTrainer

log = logging.getLogger(__name__)


def microbatch_source(job: Job, engine: Engine, step: int) -> MicrobatchIterator:
    """This rank's micro-batches of `step`, packed for its TP size and CP rank."""
    dp_rank = parallel_state.get_data_parallel_rank()
    return MicrobatchIterator(
        job.rollout,
        job.schedule.steps[step].ranks[dp_rank],
        step=step,
        dp_rank=dp_rank,
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        pad_multiple=engine.pad_multiple,
        cp_size=parallel_state.get_context_parallel_world_size(),
        cp_rank=parallel_state.get_context_parallel_rank(),
    )


def run_steps(
    engine: Engine,
    trainer: CpuTrainer,
    job: Job,
    env: TorchrunEnv,
    start: int,
    sink: Sink | None,
) -> None:
    """Train steps start..num_steps-1; `sink` is rank 0's (None elsewhere)."""
    num_steps = trainer.num_steps(job)
    digest = checkpoint.schedule_digest(job.schedule)
    begun = time.perf_counter()
    for step in range(start, num_steps):
        if (
            step == trainer.fail_at_step
            and env.restart_count == 0
            and env.rank == env.world_size - 1
        ):
            log.error(
                "trainer.fail_at_step=%d: rank %d exits now (fault injection)", step, env.rank
            )
            os._exit(1)
        tic = time.perf_counter()
        result = engine.train_step(lambda step=step: microbatch_source(job, engine, step))
        step_s = time.perf_counter() - tic
        if sink is not None:
            tokens = sum(job.schedule.lengths[i] for i in job.schedule.steps[step].samples)
            sink.log(
                {
                    "step": step,
                    **result.metrics(),
                    "perf/step_s": step_s,
                    "perf/tokens_per_s": tokens / step_s,
                    **job.batch_metrics(step),
                }
            )
            done = step + 1 - start
            eta = (time.perf_counter() - begun) / done * (num_steps - step - 1)
            log.info(
                "step %d/%d  loss %.4f  grad_norm %.3f  %.2f s  %.0f tok/s  eta %.0f s",
                step + 1,
                num_steps,
                result.loss,
                result.grad_norm,
                step_s,
                tokens / step_s,
                eta,
            )
        last = step + 1 == num_steps
        if last or (trainer.save_interval and (step + 1) % trainer.save_interval == 0):
            save(engine, job, env, step + 1, digest)


def save(engine: Engine, job: Job, env: TorchrunEnv, steps_done: int, digest: str) -> None:
    """Every rank saves its state; once all have, rank 0 marks the checkpoint as the latest."""
    run_dir = job.run.run_dir
    checkpoint.save(run_dir, steps_done, env.rank, engine.model, engine.optimizer, digest)
    dist.barrier()
    if env.rank == 0:
        checkpoint.mark_latest(run_dir, steps_done)
        log.info(
            "Saved checkpoint after step %d in %s",
            steps_done - 1,
            checkpoint.checkpoint_root(run_dir),
        )
