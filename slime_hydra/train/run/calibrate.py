"""The calibration's workers (python -m slime_hydra.calibrate): the training engine, built as
worker.train builds it, runs every step of the job's schedule (the calibration grid, repeated)
and rank 0 writes each step's timings, the largest over all ranks, to TIMINGS in the run dir.

A step's seconds are taken where the training loop takes perf/step_s (train/run/loop.py): the
rank's micro-batch iterator and engine.train_step; with the time in megatron's schedule and in
finalize_model_grads (the gradient all-reduce) that the engine reports. With pp > 1 the workers
then time the exchange between pipeline stages on its own (`exchange_seconds`): on a grid of
equal micro-batches its cost and the per-micro-batch one grow together and a fit cannot tell
them apart."""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
from torch.distributed.elastic.multiprocessing.errors import record

from slime_hydra.files import write_file
from slime_hydra.train.job import Job
from slime_hydra.train.run.loop import rank_microbatches
from slime_hydra.train.run.worker import build_engine, rank_process
from slime_hydra.train.settings import CpuTrainer
from slime_hydra.train.step.engine import MegatronEngine

TIMINGS = "timings.json"
"""Rank 0's file in the run dir: {"steps": [[step_s, schedule_s, grad_reduce_s] per scheduled
step], "exchange_s": [seconds of one p2p exchange, per round] (empty without a pipeline)}."""
EXCHANGES = 32
"""Exchanges timed in a round of `exchange_seconds`."""
ROUNDS = 8
"""Timed rounds of exchanges (after one to warm up): their spread gives p2p_s its error."""


@record
def measure(trainer: CpuTrainer, job: Job) -> None:
    """Worker entry point: time every step of the job's schedule, in order, then (pp > 1) the
    exchange between pipeline stages with an activation of the grid's mean micro-batch."""
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
        exchange = []
        if job.layout.pp > 1:
            steps = job.schedule.steps
            tokens = sum(job.schedule.lengths) / sum(len(r) for s in steps for r in s.ranks)
            rows = tokens / job.layout.cp / (job.layout.tp if job.layout.sequence_parallel else 1)
            exchange = exchange_seconds(engine, max(1, round(rows)), ROUNDS)
        if env.rank == 0:
            run_dir = job.run.run_dir
            text = json.dumps({"steps": slowest.tolist(), "exchange_s": exchange})
            write_file(run_dir / TIMINGS, text, run_dir)


def exchange_seconds(engine: MegatronEngine, rows: int, rounds: int) -> list[float]:
    """Seconds of one exchange between neighbouring pipeline stages as megatron's schedule
    makes it (P2PCommunicator on the engine's config: the shapes, then an activation of `rows`
    tokens), each stage sending to its next and receiving from its previous at once: per round,
    the mean of EXCHANGES, the slowest rank's."""
    config = engine.chunks[0].config
    group = parallel_state.get_pipeline_model_parallel_group()
    communicator = P2PCommunicator(pp_group=group, config=config)
    activation = torch.zeros(
        rows, 1, config.hidden_size, dtype=config.pipeline_dtype, device=engine.device
    )
    seconds = []
    for _ in range(rounds + 1):  # the first round warms up
        dist.barrier(group=group)
        tic = time.perf_counter()
        for _ in range(EXCHANGES):
            communicator.send_forward_recv_forward(
                activation, recv_prev=True, tensor_shape=activation.shape
            )
        seconds.append((time.perf_counter() - tic) / EXCHANGES)
    slowest = torch.tensor(seconds[1:], dtype=torch.float64, device=engine.device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()
