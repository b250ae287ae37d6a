"""Micro-batch scheduling: layouts, batching strategies, the Schedule and its metrics (no torch)."""

from slime_hydra.schedule.dynamic import DynamicBatching
from slime_hydra.schedule.fixed import FixedBatching
from slime_hydra.schedule.invariants import violations
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.legacy import SlimeLegacyBatching
from slime_hydra.schedule.metrics import microbatch_lower_bound, step_metrics
from slime_hydra.schedule.schedule import (
    Schedule,
    StepSchedule,
    breaks_cap,
    step_index,
    step_number,
)
from slime_hydra.schedule.strategy import BatchingStrategy

__all__ = [
    "BatchingStrategy",
    "DynamicBatching",
    "FixedBatching",
    "ParallelLayout",
    "Schedule",
    "SlimeLegacyBatching",
    "StepSchedule",
    "breaks_cap",
    "microbatch_lower_bound",
    "step_index",
    "step_metrics",
    "step_number",
    "violations",
]
