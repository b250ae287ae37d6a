"""Config schema (registered in Hydra's ConfigStore), object building, and start-up validation.

Each config group's YAML extends a `base_*` schema here, so a typo or a wrong type fails at
composition; `validate` then checks what spans fields, before anything runs.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, get_type_hints

from hydra.core.config_store import ConfigStore
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import MISSING, DictConfig, OmegaConf

from slime_hydra.data.slime_dump import SlimeDump
from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.data.trace import JsonlTrace, ParquetTrace
from slime_hydra.errors import SlimeHydraError
from slime_hydra.log.jsonl import JsonlSink
from slime_hydra.log.sink import FanOut, RunInfo
from slime_hydra.schedule import BatchingStrategy, ParallelLayout
from slime_hydra.schedule.dynamic import DpSplit, Oversize
from slime_hydra.schedule.legacy import VppRounding

log = logging.getLogger(__name__)


@dataclass
class PartitionerConfig:
    _target_: str = "slime_hydra.partition.CappedPartitioner"
    tolerance: float = 0.01
    """Stop balancing once the heaviest micro-batch is within this fraction of the bound."""
    refine_rounds: int | None = None
    """Local-search rounds per packing; null means 4 × the part count."""


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
    max_tokens_per_gpu: int | None = 8192
    oversize: Oversize = Oversize.error
    """A sample over the cap: `error` (default) or `isolate` (alone in its own micro-batch)."""
    dp_split: DpSplit = DpSplit.auto
    """`pack` (pack the step, deal parts to ranks), `kk` (split ranks first) or `auto` (best)."""
    partitioner: PartitionerConfig = field(default_factory=PartitionerConfig)


@dataclass
class LegacyBatchingConfig(BatchingConfig):
    _target_: str = "slime_hydra.schedule.SlimeLegacyBatching"
    max_tokens_per_gpu: int | None = 8192
    vpp_rounding: VppRounding = MISSING
    cap_fallback: bool = MISSING
    balance_data: bool = False
    preset: str = MISSING


def schema_of(cls: type, target: bool = True) -> type:
    """A config dataclass with the fields (types, defaults) of dataclass `cls`, led by
    `_target_` = `cls` when it is built by Hydra: one source of truth for both."""
    hints = get_type_hints(cls)
    specs: list[Any] = []
    if target:
        specs.append(("_target_", str, field(default=f"{cls.__module__}.{cls.__qualname__}")))
    for f in fields(cls):
        default = MISSING if f.default is dataclasses.MISSING else f.default
        specs.append((f.name, hints[f.name], field(default=default)))
    return make_dataclass(f"{cls.__name__}Config", specs)


@dataclass
class LoggerConfig:
    _target_: str = MISSING


@dataclass
class WandbLoggerConfig(LoggerConfig):
    """The arguments of slime_hydra.log.wandb.WandbSink (besides the run)."""

    project: str = MISSING
    entity: str | None = MISSING
    mode: str | None = MISSING
    """online | offline | disabled; null means WANDB_MODE if set, else offline."""
    tags: list[str] | None = MISSING
    init_timeout: float = MISSING
    """Seconds wandb.init may wait for the server before the run goes on without wandb."""


@dataclass
class Config:
    batching: Any = MISSING
    parallel: Any = MISSING
    data: Any = MISSING
    model: Any = MISSING
    trainer: Any = MISSING
    logger: Any = MISSING
    seed: int = 1234


def register_configs() -> None:
    """Store the schemas the YAML files extend (`defaults: [base_<name>, _self_]`)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(group="parallel", name="base_parallel", node=schema_of(ParallelLayout, target=False))
    cs.store(group="batching", name="base_fixed", node=FixedBatchingConfig)
    cs.store(group="batching", name="base_dynamic", node=DynamicBatchingConfig)
    cs.store(group="batching", name="base_legacy", node=LegacyBatchingConfig)
    cs.store(group="data", name="base_synthetic_grpo", node=schema_of(SyntheticGRPO))
    cs.store(group="data", name="base_jsonl", node=schema_of(JsonlTrace))
    cs.store(group="data", name="base_parquet", node=schema_of(ParquetTrace))
    cs.store(group="data", name="base_slime_dump", node=schema_of(SlimeDump))
    # Imported here: the trainers import this module (for open_sinks) in turn.
    from slime_hydra.train.plan import PlanTrainer
    from slime_hydra.train.trainer import CpuTrainer, GpuTrainer

    cs.store(group="trainer", name="base_plan", node=schema_of(PlanTrainer))
    cs.store(group="trainer", name="base_cpu", node=schema_of(CpuTrainer))
    cs.store(group="trainer", name="base_gpu", node=schema_of(GpuTrainer))
    cs.store(group="logger", name="base_logger", node=LoggerConfig)
    cs.store(group="logger", name="base_wandb", node=WandbLoggerConfig)


def build(node: DictConfig, **runtime: Any) -> Any:
    """Instantiate a `_target_` node, then call it with the runtime arguments (kept as objects,
    not converted to config), surfacing our errors unwrapped."""
    log.info("Instantiating <%s>", node._target_)
    try:
        factory = instantiate(node, _partial_=True)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, SlimeHydraError):
            raise exc.__cause__ from None
        raise SlimeHydraError(str(exc)) from None
    return factory(**runtime)


def layout_of(cfg: DictConfig) -> ParallelLayout:
    """The ParallelLayout that `cfg.parallel` describes (its constructor checks the sizes)."""
    return ParallelLayout(**OmegaConf.to_container(cfg.parallel, resolve=True))


def validate(cfg: DictConfig) -> tuple[ParallelLayout, BatchingStrategy]:
    """Check the whole config before anything runs; return the layout and batching strategy."""
    layout = layout_of(cfg)
    strategy = build(cfg.batching, layout=layout)
    strategy.check_step_size(strategy.global_batch_size)
    group = OmegaConf.select(cfg, "data.n_samples_per_prompt")
    if group is not None and strategy.global_batch_size % group:
        raise SlimeHydraError(
            f"batching.global_batch_size={strategy.global_batch_size} is not a multiple of "
            f"data.n_samples_per_prompt={group}, so a rollout group would straddle two steps; "
            "set batching.global_batch_size to a multiple of the group size."
        )
    return layout, strategy


def open_sinks(cfg: DictConfig, run: RunInfo) -> FanOut:
    """metrics.jsonl in the run dir (always), then the `logger` group's sink."""
    return FanOut([JsonlSink(run.run_dir / "metrics.jsonl"), build(cfg.logger, run=run)])
