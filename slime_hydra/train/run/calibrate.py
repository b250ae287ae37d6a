"""The calibration's workers (python -m slime_hydra.calibrate): the training engine, built as
worker.train builds it, runs every step of the job's schedule (the calibration grid, repeated)
and rank 0 writes each step's timings, the largest over all ranks, to TIMINGS in the run dir.

A step's seconds are taken where the training loop takes perf/step_s (train/run/loop.py): the
rank's micro-batch iterator and engine.train_step; with the time in megatron's schedule and in
finalize_model_grads (the gradient all-reduce) that the engine reports."""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record

from slime_hydra.errors import SlimeHydraError
from slime_hydra.train.job import Job
from slime_hydra.train.run.distributed import destroy_distributed, init_distributed, seed_everything
from slime_hydra.train.run.loop import rank_microbatches
from slime_hydra.train.run.torchrun import torchrun_env
from slime_hydra.train.run.worker import Stopped, build_engine, raise_on_sigterm
from slime_hydra.train.settings import CpuTrainer

TIMINGS = "timings.json"
"""Rank 0's file in the run dir: [[step_s, schedule_s, grad_reduce_s] per scheduled step]."""


@record
def measure(trainer: CpuTrainer, job: Job) -> None:
    """Worker entry point: time every step of the job's schedule, in order."""
    env = torchrun_env()
    if env is None:
        raise SlimeHydraError("measure() runs in a torchrun worker (RANK, WORLD_SIZE unset).")
    raise_on_sigterm()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.local_world_size))
    layout = job.layout
    init_distributed(layout.tp, layout.pp, layout.cp, trainer.backend, layout.vpp)
    try:
        seed_everything(job.seed)
        engine = build_engine(trainer, job)
        timings = []
        for step in job.schedule.steps:
            tic = time.perf_counter()
            result = engine.train_step(rank_microbatches(job.iterator, job.rollout, step))
            step_s = time.perf_counter() - tic
            timings.append([step_s, result.schedule_s, result.grad_reduce_s])
        slowest = torch.tensor(timings, dtype=torch.float64, device=engine.device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        if env.rank == 0:
            (job.run.run_dir / TIMINGS).write_text(json.dumps(slowest.tolist()))
    except (Exception, Stopped) as exc:
        get_error_handler().record_exception(exc)
        raise
    finally:
        destroy_distributed()
