"""Config schema (registered in Hydra's ConfigStore), object building, and start-up validation.

Each config group's YAML extends a `base_*` schema here, so a typo or a wrong type fails at
composition; `validate` then checks what spans fields, before anything runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import math
from dataclasses import dataclass, field, fields, make_dataclass, replace
from typing import Any, NamedTuple, get_type_hints

from hydra.core.config_store import ConfigStore
from hydra.utils import get_object
from omegaconf import MISSING, DictConfig, OmegaConf

from slime_hydra.calibration import load_step_cost
from slime_hydra.data.iterator import padding
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.slime_dump import SlimeDump
from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.data.text import TextRollouts
from slime_hydra.data.trace import JsonlTrace, ParquetTrace
from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checks import check_tensor_parallel, model_dims
from slime_hydra.instantiate import build, factory
from slime_hydra.log.sink import RunInfo
from slime_hydra.log.wandb import WandbSink
from slime_hydra.partition import BalancedPacker
from slime_hydra.rundir import flatten
from slime_hydra.schedule import BatchingStrategy, ParallelLayout, Schedule
from slime_hydra.schedule.cost import ModelDims, flops_coefficients
from slime_hydra.schedule.dynamic import Balance, Count, Oversize
from slime_hydra.schedule.legacy import VppRounding
from slime_hydra.schedule.steptime import StepCost
from slime_hydra.train.job import Job, plan_steps
from slime_hydra.train.settings import CpuTrainer, GpuTrainer, PlanTrainer

log = logging.getLogger(__name__)


def schema_of(cls: type, target: bool | str = True) -> type:
    """A config dataclass with the fields (types, defaults) of dataclass `cls`, led by
    `_target_` = `cls` (or the import path `target` names) when it is built by Hydra: one
    source of truth for both."""
    hints = get_type_hints(cls)
    specs: list[Any] = []
    if target:
        path = target if isinstance(target, str) else f"{cls.__module__}.{cls.__qualname__}"
        specs.append(("_target_", str, field(default=path)))
    for f in fields(cls):
        default = MISSING if f.default is dataclasses.MISSING else f.default
        specs.append((f.name, hints[f.name], field(default=default)))
    return make_dataclass(f"{cls.__name__}Config", specs)


def schema_of_signature(cls: type, runtime: tuple[str, ...]) -> type:
    """A config dataclass from the constructor of a (non-dataclass) class, led by `_target_`:
    the constructor's defaults are the config's, so they are written once. `runtime` names the
    arguments passed when the object is built, which are not config."""
    hints = get_type_hints(cls.__init__)
    specs: list[Any] = [("_target_", str, field(default=f"{cls.__module__}.{cls.__qualname__}"))]
    for p in list(inspect.signature(cls).parameters.values()):
        if p.name in runtime:
            continue
        default = MISSING if p.default is inspect.Parameter.empty else p.default
        specs.append((p.name, hints[p.name], field(default=default)))
    return make_dataclass(f"{cls.__name__}Config", specs)


PartitionerConfig = schema_of(BalancedPacker, "slime_hydra.partition.BalancedPacker")

DEFAULT_MAX_TOKENS_PER_GPU = 8192
"""batching.max_tokens_per_gpu of the presets that need a cap (dynamic, legacy)."""


@dataclass
class BatchingConfig:
    _target_: str = MISSING
    global_batch_size: int = 128
    """Samples per optimizer step over all DP ranks."""
    max_tokens_per_gpu: int | None = None
    """Token cap of one micro-batch per GPU; the cap per DP rank is this × cp."""


@dataclass
class FixedBatchingConfig(BatchingConfig):
    _target_: str = "slime_hydra.schedule.FixedBatching"
    micro_batch_size: int = 1


@dataclass
class DynamicBatchingConfig(BatchingConfig):
    _target_: str = "slime_hydra.schedule.DynamicBatching"
    max_tokens_per_gpu: int | None = DEFAULT_MAX_TOKENS_PER_GPU
    oversize: Oversize = Oversize.error
    """A sample over the cap: `error` (default) or `isolate` (alone in its own micro-batch)."""
    partitioner: PartitionerConfig = field(default_factory=PartitionerConfig)
    balance: Balance = Balance.tokens
    """`tokens` or `flops` (a·L + b·L² per sequence from the model group); the cap is hard."""
    count: Count = Count.min
    """Micro-batches per rank: `min`, the fewest the cap allows, or `fastest`, the count at or
    above it (and the order) whose step the cost model simulates fastest (trainer.cost, or
    the analytic model of trainer.achieved_tflops)."""
    count_margin: float = 0.02
    """`fastest` takes more micro-batches than the fewest only where they simulate faster by
    more than this share (the model's error between batchings of one layout measured 1-7%;
    fastest lost where it took more for ≤ 1.3% and won 1.16× for 6.8%: docs/cost_model.md);
    the order of the fewest is chosen either way."""


@dataclass
class LegacyBatchingConfig(BatchingConfig):
    _target_: str = "slime_hydra.schedule.SlimeLegacyBatching"
    max_tokens_per_gpu: int | None = DEFAULT_MAX_TOKENS_PER_GPU
    vpp_rounding: VppRounding = MISSING
    cap_fallback: bool = MISSING
    balance_data: bool = False
    preset: str = MISSING


@dataclass
class IteratorConfig:
    """The micro-batch iterator (slime_hydra.data.iterator.MicrobatchIterator or a replacement
    with its constructor); the engine adds the rollout, the rank's micro-batches and its place."""

    _target_: str = "slime_hydra.data.iterator.MicrobatchIterator"
    pad_multiple: int | None = None
    """Pad each packed micro-batch to a multiple of this many tokens; null means tp × 128."""


@dataclass
class LoggerConfig:
    _target_: str = MISSING


WandbLoggerConfig = schema_of_signature(WandbSink, runtime=("run", "schedule"))
"""The arguments of slime_hydra.log.wandb.WandbSink besides the run and its schedule."""


@dataclass
class Config:
    batching: Any = MISSING
    parallel: Any = MISSING
    data: Any = MISSING
    model: Any = MISSING
    trainer: Any = MISSING
    iterator: Any = MISSING
    logger: Any = MISSING
    seed: int = 1234


def register_configs() -> None:
    """Store the schemas the YAML files extend (`defaults: [/base_<name>@_here_, _self_]`). They
    sit at the root, outside the config groups, so that neither `--help` nor shell completion
    offers them as options (`batching=base_dynamic`)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="base_parallel", node=schema_of(ParallelLayout, target=False))
    cs.store(name="base_fixed", node=FixedBatchingConfig)
    cs.store(name="base_dynamic", node=DynamicBatchingConfig)
    cs.store(name="base_legacy", node=LegacyBatchingConfig)
    cs.store(name="base_synthetic_grpo", node=schema_of(SyntheticGRPO))
    cs.store(name="base_jsonl", node=schema_of(JsonlTrace))
    cs.store(name="base_parquet", node=schema_of(ParquetTrace))
    cs.store(name="base_slime_dump", node=schema_of(SlimeDump))
    cs.store(name="base_text", node=schema_of(TextRollouts))
    cs.store(name="base_plan", node=schema_of(PlanTrainer))
    cs.store(name="base_cpu", node=schema_of(CpuTrainer))
    cs.store(name="base_gpu", node=schema_of(GpuTrainer))
    cs.store(name="base_iterator", node=IteratorConfig)
    cs.store(name="base_logger", node=LoggerConfig)
    cs.store(name="base_wandb", node=WandbLoggerConfig)


def layout_of(cfg: DictConfig) -> ParallelLayout:
    """The ParallelLayout that `cfg.parallel` describes (its constructor checks the sizes)."""
    return ParallelLayout(**OmegaConf.to_container(cfg.parallel, resolve=True))


CHECKED_GROUPS = ("batching", "parallel", "data", "trainer", "iterator", "logger")
"""Groups whose keys are the arguments of one class: a key it does not take is an error."""

_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}

RUNTIME_ARGS = {
    "batching": {"layout", "flops_coefficients", "step_cost"},
    "iterator": {"batch", "microbatches", "step", "dp_rank", "tp_size", "cp_size", "cp_rank"},
    "logger": {"run", "schedule"},
}
"""Arguments a group's object gets when it is built, not from the config: no setting."""


def _accepted(node: DictConfig, group: str) -> set[str] | None:
    """The keys the node's class takes (None: it takes any)."""
    if group == "parallel":
        return {f.name for f in fields(ParallelLayout)}
    target = node.get("_target_")
    if not isinstance(target, str):
        return None
    try:
        params = inspect.signature(get_object(target)).parameters.values()
    except (ImportError, AttributeError, ValueError, TypeError):
        return None  # instantiation reports a bad _target_ itself
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return ({p.name for p in params} - RUNTIME_ARGS.get(group, set())) | _HYDRA_KEYS


def _unknown_keys(node: DictConfig, where: str, group: str) -> list[tuple[str, list[str]]]:
    """(dotted key, the keys its node takes) of each key no class reads, nested nodes too."""
    accepted = _accepted(node, group)
    out = []
    for key in node:
        value = node._get_node(key)
        if accepted is not None and key not in accepted:
            out.append((f"{where}.{key}", sorted(accepted - _HYDRA_KEYS)))
        elif isinstance(value, DictConfig) and "_target_" in value:
            out += _unknown_keys(value, f"{where}.{key}", key)
    return out


def check_keys(cfg: DictConfig) -> None:
    """Every required value is set and every key is read by something: `data=jsonl` without
    data.path, or `+parallel.dpp=4` (Hydra's own hint after a typo), is one clear error."""
    missing = sorted(k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra."))
    if missing:
        raise SlimeHydraError(
            f"{', '.join(missing)} must be set: add {' '.join(f'{k}=...' for k in missing)} to "
            "the command (e.g. data=jsonl needs data.path=/path/to/trace.jsonl)."
        )
    known = {f.name for f in fields(Config)} | {"hydra"}
    for key in cfg:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known - {"hydra"}), n=2)
            hint = f"Did you mean {' or '.join(close)}? " if close else ""
            raise SlimeHydraError(
                f"{key} is not a setting: nothing reads it, so a `+{key}=...` override would be "
                f"silently ignored. {hint}The top-level settings are: "
                f"{', '.join(sorted(known - {'hydra'}))}."
            )
    for group in CHECKED_GROUPS:
        node = cfg.get(group)
        if not isinstance(node, DictConfig):
            continue
        for key, accepted in _unknown_keys(node, group, group):
            name = key.rsplit(".", 1)[1]
            close = difflib.get_close_matches(name, accepted, n=2)
            parent = key.rsplit(".", 1)[0]
            hint = f"Did you mean {' or '.join(f'{parent}.{c}' for c in close)}? " if close else ""
            raise SlimeHydraError(
                f"{key} is not a setting: nothing reads it, so a `+{key}=...` override would be "
                f"silently ignored. {hint}"
                + (
                    f"The settings there are: {', '.join(accepted)}."
                    if accepted
                    else f"{parent}'s _target_ takes no settings."
                )
            )


INT64_MAX = 2**63 - 1

SEED_RANGE = (0, 2**32 - 1)
"""numpy's and torch's seeds: what `seed` may be."""


def check_integers(cfg: DictConfig) -> None:
    """Every integer in the config fits int64 (numpy, torch and megatron take nothing wider),
    and `seed` is one numpy and torch accept."""
    for key, value in flatten(OmegaConf.to_container(cfg, resolve=True)).items():
        integer = isinstance(value, int) and not isinstance(value, bool)
        if integer and not -INT64_MAX - 1 <= value <= INT64_MAX:
            raise SlimeHydraError(
                f"{key}={value} does not fit a 64-bit integer (at most {INT64_MAX}); set "
                f"{key} to a value in range."
            )
    seed = cfg.get("seed")
    if (
        isinstance(seed, bool)
        or not isinstance(seed, int)
        or not (SEED_RANGE[0] <= seed <= SEED_RANGE[1])
    ):
        raise SlimeHydraError(
            f"seed={seed!r} is not a seed numpy and torch accept (an integer from {SEED_RANGE[0]} "
            f"to {SEED_RANGE[1]}); set seed=... in that range."
        )


def step_cost_of(cfg: DictConfig, dims: ModelDims, layout: ParallelLayout) -> StepCost:
    """The run's step cost model: trainer.cost's calibration, else the analytic model of the
    trainer's achieved_tflops and microbatch_overhead_ms (schedule/steptime.py), for micro-batches
    packed as the iterator packs them."""
    path = OmegaConf.select(cfg, "trainer.cost")
    if path:
        cost = load_step_cost(path, dims.name, layout)
    else:
        cost = StepCost.analytic(
            flops_coefficients(dims),
            cfg.trainer.achieved_tflops,
            cfg.trainer.microbatch_overhead_ms,
            layout,
        )
    multiple = padding(OmegaConf.select(cfg, "iterator.pad_multiple"), layout.tp, layout.cp)
    return replace(cost, pad_multiple=multiple, cp=layout.cp)


class Validated(NamedTuple):
    """What `validate` builds while it checks: the layout, the batching strategy, the model's
    dims and the step cost model."""

    layout: ParallelLayout
    strategy: BatchingStrategy
    dims: ModelDims
    cost: StepCost


def validate(cfg: DictConfig) -> Validated:
    """Check the whole config before anything runs (what the workers would reject included:
    int64 ranges, the seed, the model's values, megatron's tensor-parallel split, a bad
    trainer.cost); return what it built."""
    check_keys(cfg)
    check_integers(cfg)
    layout = layout_of(cfg)
    dims = model_dims(cfg.model)
    check_tensor_parallel(dims, layout.tp)
    runtime: dict[str, Any] = {}
    if OmegaConf.select(cfg, "batching.balance") == Balance.flops:
        # The same cost model that plan mode's sim/* and the flops metrics use.
        runtime["flops_coefficients"] = flops_coefficients(dims)
    cost = step_cost_of(cfg, dims, layout)
    if OmegaConf.select(cfg, "batching.count") == Count.fastest:
        runtime["step_cost"] = cost
    strategy = build(cfg.batching, layout=layout, **runtime)
    strategy.check_step_size(strategy.global_batch_size)
    timeout = OmegaConf.select(cfg, "logger.init_timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise SlimeHydraError(
            f"logger.init_timeout={timeout} must be a positive number of seconds (how long "
            "wandb.init may wait for the server); e.g. logger.init_timeout=60."
        )
    group = OmegaConf.select(cfg, "data.n_samples_per_prompt")
    if isinstance(group, int) and group < 1:
        raise SlimeHydraError(
            f"data.n_samples_per_prompt={group} must be a positive integer (samples per prompt)."
        )
    if group is not None and strategy.global_batch_size % group:
        raise SlimeHydraError(
            f"batching.global_batch_size={strategy.global_batch_size} is not a multiple of "
            f"data.n_samples_per_prompt={group}, so a rollout group would straddle two steps; "
            "set batching.global_batch_size to a multiple of the group size."
        )
    return Validated(layout, strategy, dims, cost)


def job_of(
    cfg: DictConfig,
    checked: Validated,
    run: RunInfo,
    rollout: RolloutBatch,
    schedule: Schedule,
    tokenizer: str | None = None,
) -> Job:
    """The Job of a validated config's `rollout` and its `schedule`: the iterator and logger
    groups' factories, and each step's batch metrics and predicted time planned once here."""
    layout, strategy, dims, cost = checked
    return Job(
        run=run,
        layout=layout,
        strategy=strategy,
        rollout=rollout,
        schedule=schedule,
        dims=dims,
        seed=cfg.seed,
        iterator=factory(cfg.iterator),
        logger=factory(cfg.logger),
        tokenizer=tokenizer,
        cost=cost,
        planned=plan_steps(schedule, layout, dims, cost),
    )
