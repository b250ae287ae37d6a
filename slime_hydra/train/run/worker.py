"""A training worker process: join the process group, build the model, resume, run the loop."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import get_error_handler, record

from slime_hydra.errors import SlimeHydraError, Stopped
from slime_hydra.log.sink import NoSink, Sink
from slime_hydra.log.sinks import open_sinks
from slime_hydra.train.job import Job
from slime_hydra.train.run import checkpoint
from slime_hydra.train.run.distributed import destroy_distributed, init_distributed, seed_everything
from slime_hydra.train.run.host_memory import keep_freed_memory
from slime_hydra.train.run.loop import run_steps
from slime_hydra.train.run.stops import ignore_stops, raise_on_stop
from slime_hydra.train.run.torchrun import TorchrunEnv, torchrun_env
from slime_hydra.train.run.warmup import warm_up
from slime_hydra.train.settings import CpuTrainer
from slime_hydra.train.step import cpu_shim
from slime_hydra.train.step.engine import MegatronEngine, PolicyLoss
from slime_hydra.train.step.optimizer import OptimizerSettings

log = logging.getLogger(__name__)


def close_sink(sink: Sink) -> None:
    """Close this rank's sinks to the end (rank 0's write out wandb's steps; the others' do
    nothing): a stop that arrives meanwhile or in the teardown after it (the launcher stopping
    this rank after a peer failed) is ignored, SIGKILL still bounds it."""
    ignore_stops()
    sink.close()


def check_same_run_dir(job: Job) -> None:
    """Every rank must write to rank 0's run dir (torchrun ranks compose their configs alone)."""
    mine = [str(job.run.run_dir.resolve())]
    theirs = list(mine)
    dist.broadcast_object_list(theirs, src=0)
    if theirs != mine:
        raise SlimeHydraError(
            f"rank {dist.get_rank()} resolved the run dir {mine[0]} but rank 0 resolved "
            f"{theirs[0]}: ${{now:}} differs between processes; pass the same "
            "hydra.run.dir=... to every rank (launch/torchrun.sh does)."
        )


def build_engine(trainer: CpuTrainer, job: Job) -> MegatronEngine:
    """The one engine on this trainer's device and dtype, with model.path's weights where given;
    on CPU, megatron's CUDA placements are mapped to the CPU first (train/step/cpu_shim.py)."""
    if trainer.device == "cpu":
        cpu_shim.apply()
    engine = MegatronEngine(
        job.dims,
        job.layout,
        OptimizerSettings(trainer.lr, trainer.weight_decay, trainer.clip_grad),
        PolicyLoss(trainer.eps_clip, trainer.eps_clip_high),
        seed=job.seed,
        device=trainer.device,
        params_dtype=getattr(torch, trainer.params_dtype),
        use_distributed_optimizer=trainer.use_distributed_optimizer,
    )
    if job.dims.path is not None:  # model=hf: its weights replace the seeded ones
        from slime_hydra.train.step.hf_bridge import load_into_engine

        load_into_engine(engine, job.dims)
    return engine


def steps_done(
    trainer: CpuTrainer, job: Job, env: TorchrunEnv, engine: MegatronEngine
) -> tuple[int, dict[str, int]]:
    """0 for a fresh run; the saved step count on resume or after an elastic restart (the run
    goes on with the next step), with the step loop's counters (e.g. skipped steps) as saved."""
    run_dir = job.run.run_dir
    if not (trainer.resume or env.restart_count) or checkpoint.latest_step(run_dir) is None:
        return 0, {}
    digest = checkpoint.schedule_digest(job.schedule)
    ident = checkpoint.identity(job.layout, job.dims)
    done, counters = checkpoint.load(
        run_dir, env.rank, engine.model, engine.optimizer, digest, ident
    )
    if env.rank == 0:
        log.info("Resuming after step %d (restart %d)", done, env.restart_count)
    return done, counters


@contextmanager
def rank_process(trainer: CpuTrainer, job: Job, entry: str) -> Iterator[TorchrunEnv]:
    """What every worker entry point (train, the calibration's measure) runs inside: the
    torchrun env, SIGINT and SIGTERM raised as Stopped, this rank's share of the threads, on
    CPU freed memory kept for reuse (train/run/host_memory.py), the process groups, the job's
    seeds, and rank 0's run dir checked as this rank's; this rank's own error recorded before
    teardown makes its peers fail as well (the launcher reports the rank where a failure
    happened, train/run/launch.py)."""
    env = torchrun_env()
    if env is None:
        raise SlimeHydraError(f"{entry}() runs in a torchrun worker (RANK, WORLD_SIZE, ... unset).")
    raise_on_stop()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // env.local_world_size))
    if trainer.device == "cpu":
        keep_freed_memory()
    layout = job.layout
    init_distributed(layout.tp, layout.pp, layout.cp, trainer.backend, layout.vpp)
    try:
        seed_everything(job.seed)
        check_same_run_dir(job)
        yield env
    except (Exception, Stopped) as exc:
        get_error_handler().record_exception(exc)
        raise
    finally:
        destroy_distributed()


@record
def train(trainer: CpuTrainer, job: Job) -> None:
    """Worker entry point, the same under torchrun and under the elastic launcher: join the
    process groups, build the engine, resume, open rank 0's log, run the steps, close."""
    with rank_process(trainer, job, "train") as env:
        engine = build_engine(trainer, job)
        done, counters = steps_done(trainer, job, env, engine)
        num_steps = trainer.num_steps(job)
        # Rank 0 logs (metrics.jsonl keeps the rows of the steps done: each step once); every
        # other rank gets a sink that does nothing.
        sink = open_sinks(job.logger, job.run, job.schedule, done) if env.rank == 0 else NoSink()
        # Rank 0's logger start (wandb.init, bounded by logger.init_timeout) ends before any
        # collective of the step loop: the other ranks wait here, not inside an all-reduce.
        dist.barrier()
        try:
            if trainer.warmup and done < num_steps:
                warm_up(engine, job, done, num_steps)
            run_steps(engine, trainer, job, env, done, num_steps, sink, counters)
        finally:
            close_sink(sink)
