"""Step time: what a training step costs, term by term, and the step megatron's schedule makes
of it (schedule.pipeline). The terms come from a calibration on the machine that runs
(`python -m slime_hydra.calibrate`, loaded with trainer.cost=FILE) or, uncalibrated, from the
FLOPs of the model at trainer.achieved_tflops plus trainer.microbatch_overhead_ms.

A micro-batch of sequences L_1..L_n costs, forward and backward through the whole model on one
model replica of the layout (its tp × cp GPUs; a pipeline stage's model chunk takes 1/(pp·vpp)
of it): token_s · ΣL + square_s · ΣL² + sequence_s · n + microbatch_s + microbatch_square_s ·
(ΣL)² (sequence_s: what attention and the loss pay per packed sequence, e.g. one kernel call
each under CP; microbatch_square_s: what each token costs more the larger its micro-batch,
e.g. activations that outgrow a CPU's caches). Each
exchange between pipeline stages (one blocking call of megatron's schedule, sending and
receiving activations and gradients; schedule.pipeline) costs p2p_s; the step ends with the DP
gradient all-reduce and the optimizer step, once each.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.base import Work
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.pipeline import simulate_pipelines

BACKWARD_SHARE = 2 / 3  # backward costs twice the forward

EVENT_VISITS = 40
"""What one replayed call of a simulated pipeline costs in `Work` item visits (the planner's
unit, 40-60 ns): 2.2-2.6 µs a call on this 2-core machine (pp 2-8, vpp 1-2, 16-64
micro-batches; 2026-12-03), whatever the number of pipelines simulated at once up to ~128;
each one more adds ~3.5 ns a call, 1/WIDTH_PER_VISIT of a visit."""
BUILD_VISITS = 60
"""What finding the replay order of a (pp, vpp, group, k) costs a call, in visits: 2.4-2.7 µs
(the same runs)."""
WIDTH_PER_VISIT = 16


TERMS = (
    "token_s",
    "square_s",
    "microbatch_s",
    "sequence_s",
    "microbatch_square_s",
    "p2p_s",
    "allreduce_s",
    "optimizer_s",
)
"""The step cost's terms, in seconds (a calibration file's `terms`)."""


@dataclass(frozen=True)
class StepCost:
    """Seconds per term of a step (see the module docstring); `source` says where they came
    from: a calibration file, or "analytic" (uncalibrated). `pad_multiple` and `cp` say how the
    engine packs a micro-batch (data/packing.py), so that it costs the tokens the engine runs:
    under context parallelism each sequence rounded up to a multiple of 2·cp, and each rank's
    share of the packed row padded to a multiple of `pad_multiple` by one more sequence."""

    token_s: float
    square_s: float
    microbatch_s: float
    sequence_s: float = 0.0
    microbatch_square_s: float = 0.0
    p2p_s: float = 0.0
    allreduce_s: float = 0.0
    optimizer_s: float = 0.0
    source: str = "analytic"
    pad_multiple: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for name in TERMS:
            value = getattr(self, name)
            if not (isinstance(value, float | int) and 0 <= value < 1e6):
                raise SlimeHydraError(
                    f"step cost {name}={value!r} ({self.source}) must be a number of seconds "
                    ">= 0; recalibrate (python -m slime_hydra.calibrate) or drop trainer.cost."
                )
        if self.pad_multiple < 1 or self.cp < 1:
            raise SlimeHydraError(
                f"step cost packing pad_multiple={self.pad_multiple}, cp={self.cp}: both must "
                "be at least 1 (iterator.pad_multiple, parallel.cp)."
            )

    @classmethod
    def analytic(
        cls,
        flops_coefficients: tuple[float, float],
        achieved_tflops: float,
        microbatch_overhead_ms: float,
        layout: ParallelLayout,
    ) -> StepCost:
        """The uncalibrated model: a·L + b·L² FLOPs per sequence at `achieved_tflops` per GPU
        over the tp × cp GPUs of a replica, a fixed overhead per micro-batch, communication
        free."""
        linear, quadratic = flops_coefficients
        per_s = achieved_tflops * 1e12 * layout.tp * layout.cp
        return cls(linear / per_s, quadratic / per_s, microbatch_overhead_ms / 1e3)

    @classmethod
    def from_mapping(cls, terms: Mapping[str, object], source: str) -> StepCost:
        """Build from a calibration file's `terms`, naming any unknown or missing term."""
        known = set(TERMS)
        unknown = sorted(set(terms) - known)
        missing = sorted({"token_s", "square_s", "microbatch_s"} - set(terms))
        if unknown or missing:
            raise SlimeHydraError(
                f"{source}: the step cost terms {sorted(terms)} have unknown {unknown} and "
                f"lack {missing}; expected {sorted(known)}. Recalibrate with python -m "
                "slime_hydra.calibrate, or drop trainer.cost for the analytic model."
            )
        return cls(**{k: terms[k] for k in terms}, source=source)  # type: ignore[arg-type]

    def seconds(self, tokens: Any, squares: Any, sequences: Any) -> Any:
        """Forward and backward through the whole model of micro-batches of these tokens (ΣL),
        squared lengths (ΣL²) and sequences (n): of floats a float, of arrays an array."""
        return (
            self.token_s * tokens
            + self.square_s * squares
            + self.sequence_s * sequences
            + self.microbatch_s
            + self.microbatch_square_s * tokens * tokens
        )


@dataclass(frozen=True)
class StepTiming:
    """A simulated step: its time, the idle share of the pipeline stages of all DP ranks over
    it, the slowest DP rank, and the share of the step that is communication after the
    pipelines (all-reduce and optimizer)."""

    step_s: float
    bubble_frac: float
    slowest_rank: int
    tail_s: float


def simulate_step(
    ranks: Sequence[Sequence[Sequence[int]]], layout: ParallelLayout, cost: StepCost
) -> StepTiming:
    """Simulate one step: `ranks[r][m]` are the lengths of micro-batch m of DP rank r (see
    simulate_seconds)."""
    counts = np.array([len(mb) for rank in ranks for mb in rank], dtype=np.int64)
    lengths = np.fromiter(chain.from_iterable(chain.from_iterable(ranks)), dtype=np.int64)
    return simulate_flat(lengths, counts, [len(rank) for rank in ranks], layout, cost)


def simulate_flat(
    lengths: np.ndarray,
    counts: np.ndarray,
    per_rank: Sequence[int],
    layout: ParallelLayout,
    cost: StepCost,
) -> StepTiming:
    """simulate_step of micro-batches laid out flat (as StepSchedule.flat gives them): the
    lengths of every micro-batch's samples in order, how many samples each micro-batch holds
    (`counts`) and how many micro-batches each rank runs (`per_rank`), rank after rank."""
    mb_of = np.repeat(np.arange(counts.size), counts)
    seconds = bin_seconds(mb_of, lengths, counts.size, cost)
    return simulate_seconds(np.split(seconds, np.cumsum(per_rank)[:-1]), layout, cost)


def simulate_seconds(
    seconds: Sequence[Sequence[float]] | np.ndarray, layout: ParallelLayout, cost: StepCost
) -> StepTiming:
    """Simulate one step whose DP rank r runs micro-batches of forward+backward seconds
    `seconds[r]`, in that order, through megatron's 1F1B (interleaved with vpp > 1) pipeline
    schedule (without a pipeline, one after another); the step waits for the slowest rank,
    then all-reduces and steps the optimizer."""
    rows = [np.asarray(rank, dtype=np.float64) for rank in seconds]
    pipe = np.array([row.sum() for row in rows])
    if layout.pp > 1:
        for k in {row.size for row in rows}:  # the ranks of one count simulate at once
            same = [r for r, row in enumerate(rows) if row.size == k]
            pipe[same] = pipeline_seconds(np.stack([rows[r] for r in same]), layout, cost)
    slowest = int(np.argmax(pipe))
    pipe_s = float(pipe[slowest])
    busy = sum(float(row.sum()) for row in rows)  # every stage runs 1/pp of every micro-batch
    bubble = 1 - busy / (len(rows) * layout.pp * pipe_s) if pipe_s else 0.0
    tail = cost.allreduce_s + cost.optimizer_s
    return StepTiming(pipe_s + tail, bubble, slowest, tail)


def pipeline_seconds(seconds: np.ndarray, layout: ParallelLayout, cost: StepCost) -> np.ndarray:
    """The pipeline's makespan over micro-batches of these forward+backward seconds, in order,
    for each row of `seconds` (one pipeline each) at once."""
    forward = (1 - BACKWARD_SHARE) * seconds
    return simulate_pipelines(forward, layout.pp, layout.vpp, layout.vp_group_size, cost.p2p_s)


def bin_seconds(bin_of: np.ndarray, sizes: np.ndarray, bins: int, cost: StepCost) -> np.ndarray:
    """Forward+backward seconds of each micro-batch (`bin_of`: each sample's), packed as the
    engine packs it (StepCost's pad_multiple and cp)."""
    L = sizes.astype(np.float64)
    if cost.cp > 1:
        L = np.ceil(L / (2 * cost.cp)) * (2 * cost.cp)
    tokens = np.bincount(bin_of, weights=L, minlength=bins)
    squares = np.bincount(bin_of, weights=L * L, minlength=bins)
    sequences = np.bincount(bin_of, minlength=bins).astype(np.float64)
    pad = (-(tokens // cost.cp) % cost.pad_multiple) * cost.cp
    return cost.seconds(tokens + pad, squares + pad * pad, sequences + (pad > 0))


def simulation_visits(layout: ParallelLayout, k: int, width: int, first: bool = False) -> int:
    """What simulating `width` pipelines (DP ranks, or orders of them) of k micro-batches at
    once costs in `Work` item visits (without a pipeline: a sum per rank); `first`: with
    finding the replay order of k micro-batches, as the first simulation of k does (counted
    whether or not a cache holds it, so that every rank plans alike)."""
    if layout.pp == 1:
        return k * width // WIDTH_PER_VISIT
    calls = 4 * layout.pp * layout.vpp * k  # each stage's 2·vpp·k ops, an exchange after each
    return calls * (EVENT_VISITS + width // WIDTH_PER_VISIT + (BUILD_VISITS if first else 0))


def orders(seconds: np.ndarray) -> np.ndarray:
    """Orders of each rank's micro-batches (`seconds[r]`) worth trying, `[r, i]` the i-th: as
    planned, ascending, descending, and the smallest at both ends (ascending from the first to
    the middle, descending after it), which shortens the warm-up and cool-down that 1F1B leaves
    idle."""
    ranks, k = seconds.shape
    asc = np.argsort(seconds, axis=1, kind="stable")
    ends = np.concatenate((asc[:, 0::2], asc[:, 1::2][:, ::-1]), axis=1)
    planned = np.broadcast_to(np.arange(k), (ranks, k))
    return np.stack((planned, asc, asc[:, ::-1], ends), axis=1)


def fastest_order(
    bin_of: np.ndarray,
    bin_s: np.ndarray,
    layout: ParallelLayout,
    k: int,
    cost: StepCost,
    work: Work,
) -> np.ndarray:
    """`bin_of` with each rank's micro-batches (r·k .. r·k + k - 1) reordered to the order its
    pipeline simulates fastest of those `rank_orders` tries within `work`."""
    if layout.pp == 1:
        return bin_of
    best = rank_orders(bin_s.reshape(layout.dp, k), layout, cost, work)
    start = np.arange(layout.dp)[:, None] * k
    place = np.empty(layout.dp * k, dtype=np.int64)
    place[(start + best).ravel()] = (start + np.arange(k)).ravel()
    return place[bin_of]


def rank_orders(
    seconds: np.ndarray, layout: ParallelLayout, cost: StepCost, work: Work
) -> np.ndarray:
    """For each rank (`seconds[r]`: its micro-batches' seconds), the fastest of `orders`, then
    the costliest micro-batch moved to each position in turn (k + 4 simulations a rank, all
    ranks at once, each of the two rounds only where `work` pays for it): where it runs is
    what the warm-up and cool-down of 1F1B expose. For one long micro-batch among equal short
    ones this is the best order there is (the long one's position is all that differs); ties
    keep the earlier order, so the plan's own order stays where nothing is faster."""
    ranks, k = seconds.shape
    rows = np.arange(ranks)[:, None]

    def paid(tries: int) -> bool:  # charges `work` for simulating `tries` orders a rank
        return work.pay(simulation_visits(layout, k, ranks * tries), passes=0)

    def step_s(tried: np.ndarray) -> np.ndarray:  # tried[r, i]: an order of rank r
        timed = seconds[rows[:, :, None], tried].reshape(-1, k)
        return pipeline_seconds(timed, layout, cost).reshape(ranks, -1)

    tried = orders(seconds)
    if not paid(tried.shape[1]):
        return tried[:, 0]
    times = step_s(tried)
    pick = np.argmin(times, axis=1)
    best, best_s = tried[rows[:, 0], pick], times[rows[:, 0], pick]
    if not paid(k):
        return best
    top = np.argmax(seconds, axis=1)
    rest = best[best != top[:, None]].reshape(ranks, k - 1)
    moved = np.empty((ranks, k, k), dtype=np.int64)
    for at in range(k):
        moved[:, at] = np.insert(rest, at, top, axis=1)
    moved_s = step_s(moved)
    at = np.argmin(moved_s, axis=1)
    better = moved_s[rows[:, 0], at] < best_s
    best[better] = moved[better, at[better]]
    return best
