"""trainer=cpu/gpu refuse what cannot run before any worker starts; checkpoints' metrics cut."""

from __future__ import annotations

import dataclasses
import functools
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from omegaconf import Container, OmegaConf

from slime_hydra import app
from slime_hydra.config import build
from slime_hydra.data.rollout import RolloutBatch, with_tokens
from slime_hydra.errors import SlimeHydraError
from slime_hydra.log.jsonl import JsonlSink
from slime_hydra.log.sink import RunInfo
from slime_hydra.schedule import ParallelLayout, Schedule, SlimeLegacyBatching, StepSchedule
from slime_hydra.train.job import Job
from slime_hydra.train.run import start
from slime_hydra.train.run.checks import (
    check_sequence_parallel,
    check_trainable,
    check_vpp,
    check_world_size,
)
from slime_hydra.train.settings import CpuTrainer, GpuTrainer
from tests.hardware import needs_fewer_cuda_than

SMALL = ("data.num_prompts=4", "data.n_samples_per_prompt=4", "batching.global_batch_size=8")


@pytest.fixture
def job_of(compose_cfg, tmp_path):
    """job_of(*overrides) -> (trainer, Job) planned as the app does, in tmp_path."""

    def _job(*overrides: str) -> tuple[CpuTrainer, Job]:
        cfg = compose_cfg(*SMALL, *overrides)
        run = RunInfo(tmp_path, OmegaConf.to_container(cfg), "test", None, "cpu")
        return build(cfg.trainer), app.plan(cfg, run)

    return _job


def test_cpu_is_the_default_trainer(compose_cfg):
    trainer = build(compose_cfg().trainer)
    assert type(trainer) is CpuTrainer and trainer.nproc_per_node is None
    assert type(build(compose_cfg("trainer=gpu").trainer)) is GpuTrainer


def test_a_misspelt_trainer_key_fails_at_composition(compose_cfg):
    with pytest.raises(Exception, match="nproc_per_nod"):
        compose_cfg("trainer.nproc_per_nod=2")


def test_world_size_mismatch_names_the_overrides(job_of):
    trainer, job = job_of("trainer.nproc_per_node=3")
    with pytest.raises(SlimeHydraError, match=r"trainer\.nproc_per_node=3.*parallel\.dp"):
        start.check(trainer, job)


SEQUENCE_PARALLEL = (
    "parallel.sequence_parallel=true",
    "parallel.tp=2",
    "parallel.dp=1",
    "trainer.nproc_per_node=2",
)


def test_cpu_trainer_refuses_sequence_parallel_naming_the_override(job_of):
    trainer, job = job_of(*SEQUENCE_PARALLEL)
    with pytest.raises(
        SlimeHydraError,
        match=r"sequence_parallel=true needs Transformer Engine.*sequence_parallel=false",
    ):
        start.check(trainer, job)


def test_sequence_parallel_needs_transformer_engine_layers(job_of):
    # trainer=gpu calls this after its CUDA checks: megatron's local norm would assert in every
    # rank at model build where transformer_engine cannot be imported.
    _, job = job_of(*SEQUENCE_PARALLEL)
    with pytest.raises(
        SlimeHydraError,
        match=r"trainer=gpu does where transformer_engine cannot be imported.*"
        r"sequence_parallel=false",
    ):
        check_sequence_parallel(job.layout, transformer_engine=False)
    check_sequence_parallel(job.layout, transformer_engine=True)


def test_gpu_trainer_on_a_machine_without_cuda_says_that_first(job_of):
    needs_fewer_cuda_than(1)
    trainer, job = job_of("trainer=gpu", *SEQUENCE_PARALLEL)
    with pytest.raises(SlimeHydraError, match=r"trainer=gpu needs 2 CUDA GPUs"):
        start.check(trainer, job)


@pytest.mark.parametrize(
    "layout",
    [
        ("parallel.pp=2",),
        ("parallel.cp=2",),
        ("parallel.pp=2", "parallel.vpp=2", "model.num_layers=4"),
    ],
)
def test_cpu_trainer_accepts_pipeline_and_context_parallel_layouts(job_of, layout):
    trainer, job = job_of(*layout, "parallel.dp=1", "trainer.nproc_per_node=2")
    start.check(trainer, job)


def test_layers_that_do_not_split_into_pp_vpp_chunks_are_refused(job_of):
    trainer, job = job_of(
        "parallel.pp=2", "parallel.vpp=2", "parallel.dp=1", "trainer.nproc_per_node=2"
    )
    with pytest.raises(SlimeHydraError, match=r"model\.num_layers=2 .* 2×2 = 4 .*num_layers=4"):
        start.check(trainer, job)


def test_gpu_trainer_without_cuda_stops_at_once(job_of):
    needs_fewer_cuda_than(2)
    trainer, job = job_of("trainer=gpu")
    with pytest.raises(SlimeHydraError, match=r"needs 2 CUDA GPUs.*trainer=plan"):
        start.check(trainer, job)


def test_resume_without_a_checkpoint_is_refused(job_of):
    trainer, job = job_of("trainer.resume=true")
    with pytest.raises(SlimeHydraError, match="holds no checkpoint"):
        start.check(trainer, job)


@pytest.mark.parametrize("step", [0, 3])
def test_fault_step_must_be_one_of_the_runs_steps_counted_from_1(job_of, step):
    trainer, job = job_of(f"trainer.fail_at_step={step}")
    assert trainer.num_steps(job) == 2
    with pytest.raises(SlimeHydraError, match=rf"fail_at_step={step} .*steps 1\.\.2 "):
        start.check(trainer, job)


@pytest.mark.parametrize("step", [1, 2])
def test_fault_step_may_be_the_first_or_last_step(job_of, step):
    trainer, job = job_of(f"trainer.fail_at_step={step}")
    start.check(trainer, job)


def test_a_sound_job_passes(job_of):
    trainer, job = job_of("trainer.save_interval=1")
    start.check(trainer, job)


def config_objects(value: object, path: str = "job") -> list[str]:
    """Where a config tree (DictConfig, ListConfig) hides in `value`: dataclass fields, the
    settings of a partial, dict values and sequence items, walked down."""
    if isinstance(value, Container):
        return [path]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        parts = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    elif isinstance(value, functools.partial):
        parts = [("args", value.args), *value.keywords.items()]
    elif isinstance(value, dict):
        parts = list(value.items())
    elif isinstance(value, list | tuple):
        parts = list(enumerate(value))
    else:
        return []
    return [hit for name, v in parts for hit in config_objects(v, f"{path}.{name}")]


def test_workers_get_a_frozen_job_with_no_config_tree(job_of):
    """What the workers unpickle is typed: no DictConfig to parse again, nothing to mutate."""
    trainer, job = job_of("logger=wandb", "logger.tags=[a,b]")
    assert config_objects(job) == []
    assert config_objects(trainer) == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.seed = 0  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(job))
    assert (again.dims, again.seed, again.layout) == (job.dims, job.seed, job.layout)
    assert again.logger.keywords["tags"] == ["a", "b"]


def test_empty_micro_batch_is_refused_naming_the_preset():
    # slime issue #1838's shape: DP rank 1's third micro-batch is empty.
    strategy = SlimeLegacyBatching(ParallelLayout(dp=2), None, 100, "up", True, preset="slime_1823")
    ranks = [[[0], [1], [2]], [[3, 4], [5], []]]
    schedule = Schedule(lengths=(90,) * 6, cap=100, steps=(StepSchedule.build(0, ranks),))
    with pytest.raises(
        SlimeHydraError, match=r"batching=slime_1823 .*micro-batch 2 of DP rank 1 empty at step 1 "
    ):
        check_trainable(schedule, strategy)


def vpp_schedule(num_microbatches: int) -> Schedule:
    """One step, one DP rank, micro-batches of one sample each."""
    ranks = [[[i] for i in range(num_microbatches)]]
    return Schedule(
        lengths=(1,) * num_microbatches, cap=None, steps=(StepSchedule.build(0, ranks),)
    )


@pytest.mark.parametrize(
    ("pp", "group", "m", "ok"),
    [
        (2, 2, 4, True),
        (2, 2, 5, False),
        (2, 3, 5, True),
        (2, 4, 4, True),
        (2, 4, 3, False),
        (4, 4, 6, False),
        (4, 4, 8, True),
        (2, 2, 1, False),
        (4, 8, 12, True),
    ],
)
def test_vpp_constraints_of_megatron_0_16(pp, group, m, ok):
    layout = ParallelLayout(pp=pp, vpp=2, microbatch_group_size_per_vp_stage=group)
    if ok:
        check_vpp(layout, vpp_schedule(m))
    else:
        with pytest.raises(SlimeHydraError, match="microbatch_group_size_per_vp_stage"):
            check_vpp(layout, vpp_schedule(m))


def test_world_size_check_accepts_the_layout():
    check_world_size(ParallelLayout(dp=2, tp=2), 4, "torchrun")
    with pytest.raises(SlimeHydraError, match="2×2×1×1 = 4"):
        check_world_size(ParallelLayout(dp=2, tp=2), 2, "torchrun")


def test_metrics_sink_keeps_steps_before_the_checkpoint(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in [1, 2, 3, 4, 3]))
    JsonlSink(path, steps_done=2).close()  # the checkpoint after step 2: steps 1 and 2 stay
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_lengths_only_rollout_gets_copy_task_tokens_and_keeps_its_steps():
    lengths = np.array([5, 7, 9, 4])
    rollout = RolloutBatch(
        lengths, np.array([2, 3, 4, 1]), np.array([0, 0, 1, 1]), np.array([0, 0, 1, 1])
    )
    filled = with_tokens(rollout, vocab_size=32, seed=0)
    assert filled.tokens is not None and filled.step_ids is rollout.step_ids
    np.testing.assert_array_equal(filled.tokens.total_lengths, lengths)
    assert with_tokens(filled, vocab_size=32, seed=1) is filled


def test_an_odd_pad_multiple_under_context_parallelism_is_refused_before_launch(job_of):
    # Refused where the config is checked (the step cost model packs with it), before a job.
    with pytest.raises(SlimeHydraError, match=r"pad_multiple=3 .* parallel\.cp=2.*=6"):
        job_of("iterator.pad_multiple=3", "parallel.cp=2", "parallel.dp=1")
