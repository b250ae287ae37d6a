"""Composition of every config group through Hydra's compose API, and start-up validation."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from slime_hydra.config import build, validate
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError
from slime_hydra.log.sink import RunInfo
from slime_hydra.partition import BalancedPacker
from slime_hydra.schedule import DynamicBatching, FixedBatching, SlimeLegacyBatching


@pytest.mark.parametrize(
    ("choice", "cls"),
    [
        ("dynamic", DynamicBatching),
        ("fixed", FixedBatching),
        ("slime_1848", SlimeLegacyBatching),
        ("slime_1823", SlimeLegacyBatching),
    ],
)
def test_every_batching_choice_composes_and_builds(compose_cfg, choice, cls):
    cfg = compose_cfg(f"batching={choice}", "batching.global_batch_size=64")
    strategy = validate(cfg).strategy
    assert isinstance(strategy, cls)


@pytest.mark.parametrize(("choice", "count"), [("slime_1848", 2), ("slime_1823", 4)])
def test_legacy_presets_from_the_cli_round_the_vpp_count_their_way(compose_cfg, choice, count):
    # Cap 100, one rank, VPP group 2: first-fit needs 3 bins ([60], [60], [60, 10]);
    # slime_1848 rounds 3 down to 2, slime_1823 up to 4.
    cfg = compose_cfg(
        f"batching={choice}",
        "batching.max_tokens_per_gpu=100",
        "batching.global_batch_size=4",
        "data.n_samples_per_prompt=4",
        "parallel.dp=1",
        "parallel.pp=2",
        "parallel.vpp=2",
    )
    strategy = validate(cfg).strategy
    schedule = strategy.plan([60, 60, 60, 10], [0, 1, 2, 3])
    assert schedule.steps[0].num_microbatches == count


def test_dynamic_builds_the_partitioner_hydra_instantiates(compose_cfg):
    cfg = compose_cfg("batching.partitioner.budget=7000")
    strategy = validate(cfg).strategy
    assert strategy.partitioner == BalancedPacker(budget=7000)


def test_a_user_class_plugs_in_from_the_command_line(compose_cfg):
    cfg = compose_cfg("batching._target_=tests.unit.test_config.EveryRankOneBatch")
    strategy = validate(cfg).strategy
    assert type(strategy).__name__ == "EveryRankOneBatch"


class EveryRankOneBatch(DynamicBatching):
    """A user strategy: same constructor, its own plan."""


def test_cap_is_per_gpu_times_cp(compose_cfg):
    strategy = validate(compose_cfg("parallel.cp=4", "batching.max_tokens_per_gpu=1000")).strategy
    assert strategy.cap == 4000


@pytest.mark.parametrize(
    ("choice", "source"),
    [
        ("synthetic_grpo", "SyntheticGRPO"),
        ("jsonl", "JsonlTrace"),
        ("parquet", "ParquetTrace"),
        ("slime_dump", "SlimeDump"),
    ],
)
def test_every_data_choice_composes(compose_cfg, choice, source, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    files = {
        "jsonl": tmp_path / "t.jsonl",
        "parquet": tmp_path / "t.pq",
        "slime_dump": tmp_path / "d.pt",
    }
    files["jsonl"].write_text('{"total_length": 5}\n')
    pq.write_table(pa.table({"total_length": [5]}), files["parquet"])
    sample = {
        "tokens": [1, 2, 3],
        "response_length": 1,
        "reward": 1.0,
        "loss_mask": [1],
        "index": 0,
        "group_index": 0,
    }
    torch.save({"rollout_id": 0, "samples": [sample]}, files["slime_dump"])
    overrides = [f"data={choice}"] + ([f"data.path={files[choice]}"] if choice in files else [])
    cfg = compose_cfg(*overrides)
    loaded = build(cfg.data)
    assert type(loaded).__name__ == source
    assert isinstance(loaded.load(), RolloutBatch)


@pytest.mark.parametrize("choice", ["console", "jsonl", "wandb"])
def test_every_logger_choice_builds(compose_cfg, choice, tmp_path):
    run = RunInfo(run_dir=tmp_path, config={}, name="run", group=None, job_type="plan")
    sink = build(
        compose_cfg(
            f"logger={choice}", "logger.mode=offline" if choice == "wandb" else "seed=1"
        ).logger,
        run=run,
    )
    sink.log({"step": 1, "batch/num_microbatches": 3})
    sink.close()


def test_one_name_per_logger_choice(compose_cfg):
    # logger=jsonl is "metrics.jsonl only" (written by every run); a second name for it is gone,
    # and Hydra's own error lists the choices there are.
    with pytest.raises(ConfigCompositionException, match=r"(?s)logger/none.*console.*jsonl"):
        compose_cfg("logger=none")


@pytest.mark.parametrize("choice", ["tiny", "qwen2_5_1_5b", "qwen2_5_7b"])
def test_every_model_choice_builds_its_dims(compose_cfg, choice):
    from slime_hydra.schedule.cost import ModelDims, flops_coefficients

    dims = ModelDims.from_mapping(compose_cfg(f"model={choice}").model)
    a, b = flops_coefficients(dims)
    assert a > b > 0  # the dense part adds to the attention part


def test_trainer_plan_builds(compose_cfg):
    assert type(build(compose_cfg("trainer=plan").trainer)).__name__ == "PlanTrainer"


def test_parallel_overrides_reach_the_layout(compose_cfg):
    layout = validate(
        compose_cfg(
            "parallel.dp=4",
            "parallel.pp=2",
            "parallel.vpp=2",
            "parallel.microbatch_group_size_per_vp_stage=4",
        )
    ).layout
    assert (layout.dp, layout.pp, layout.vpp, layout.microbatch_alignment) == (4, 2, 2, 4)
    assert layout.world_size == 8


def test_wrong_types_fail_at_composition(compose_cfg):
    with pytest.raises((ConfigCompositionException, ValidationError)):
        compose_cfg("parallel.dp=two")


def test_unknown_keys_fail_at_composition(compose_cfg):
    with pytest.raises(ConfigCompositionException, match=r"batching\.max_token_per_gpu"):
        compose_cfg("batching.max_token_per_gpu=5")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["parallel.vpp=2"], "parallel.pp"),
        (
            ["parallel.pp=4", "parallel.vpp=2", "parallel.microbatch_group_size_per_vp_stage=2"],
            "parallel.microbatch_group_size_per_vp_stage to 4",
        ),
        (["parallel.tp=0"], "parallel.tp"),
        (["parallel.sequence_parallel=true"], "parallel.tp to 2"),
        (["batching.max_tokens_per_gpu=0"], "batching.max_tokens_per_gpu"),
        (["batching.max_tokens_per_gpu=-5"], "batching.max_tokens_per_gpu"),
        (["batching.global_batch_size=0"], "batching.global_batch_size"),
        (["batching=fixed", "parallel.dp=3", "batching.global_batch_size=64"], "multiple of 3"),
        (
            ["batching=fixed", "batching.micro_batch_size=5", "batching.global_batch_size=64"],
            "batching.micro_batch_size",
        ),
        (
            [
                "batching=fixed",
                "batching.micro_batch_size=4",
                "batching.global_batch_size=48",
                "parallel.pp=2",
                "parallel.vpp=2",
                "parallel.microbatch_group_size_per_vp_stage=4",
            ],
            "microbatch_group_size_per_vp_stage=4",
        ),
        (["batching.global_batch_size=1"], "parallel.dp=2"),
        (["batching.global_batch_size=12"], "data.n_samples_per_prompt=8"),
        (["batching=dynamic", "batching.max_tokens_per_gpu=null"], "batching.max_tokens_per_gpu"),
    ],
)
def test_validation_names_the_override_to_change(compose_cfg, overrides, needle):
    with pytest.raises(SlimeHydraError) as err:
        validate(compose_cfg(*overrides))
    assert needle in str(err.value)


@pytest.mark.parametrize("exp", ["grpo_7b", "grpo_7b_pp2_vpp2"])
@pytest.mark.parametrize("choice", ["dynamic", "fixed", "slime_1848", "slime_1823"])
def test_experiments_validate_with_every_batching_choice(compose_cfg, exp, choice):
    cfg = compose_cfg(
        f"+exp={exp}",
        f"batching={choice}",
        "batching.micro_batch_size=4" if choice == "fixed" else "seed=1",
    )
    layout = validate(cfg).layout
    assert layout.world_size == 8


@pytest.mark.parametrize(
    ("override", "target"),
    [
        ("hydra/launcher=local_parallel", "JoblibLauncher"),
        ("hydra/launcher=slurm", "SlurmLauncher"),
        ("hydra/sweeper=optuna_cap", "OptunaSweeper"),
    ],
)
def test_sweep_plugins_compose(compose_cfg, override, target):
    cfg = compose_cfg(override, "+exp=grpo_7b", with_hydra=True)
    node = cfg.hydra.sweeper if "sweeper" in override else cfg.hydra.launcher
    assert node._target_.endswith(target)
    if "slurm" in override:
        assert (node.tasks_per_node, node.gpus_per_node) == (1, 8)  # one task per node
