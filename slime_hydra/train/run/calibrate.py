"""The calibration's workers (python -m slime_hydra.calibrate): the training engine, built as
worker.train builds it, runs every step of the job's schedule (the calibration grid, repeated)
and rank 0 writes each step's timings, the largest over all ranks, to TIMINGS in the run dir.

A step's seconds are taken where the training loop takes perf/step_s (train/run/loop.py): the
rank's micro-batch iterator and engine.train_step; with the time in megatron's schedule and in
finalize_model_grads (the gradient all-reduce) that the engine reports."""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from slime_hydra.files import write_file
from slime_hydra.train.job import Job
from slime_hydra.train.run.loop import rank_microbatches
from slime_hydra.train.run.worker import build_engine, rank_process
from slime_hydra.train.settings import CpuTrainer

TIMINGS = "timings.json"
"""Rank 0's file in the run dir: [[step_s, schedule_s, grad_reduce_s] per scheduled step]."""


@record
def measure(trainer: CpuTrainer, job: Job) -> None:
    """Worker entry point: time every step of the job's schedule, in order."""
    with rank_process(trainer, job, "measure") as env:
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
            run_dir = job.run.run_dir
            write_file(run_dir / TIMINGS, json.dumps(slowest.tolist()), run_dir)
