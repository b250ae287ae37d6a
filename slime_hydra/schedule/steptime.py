"""Step time: what a training step costs, term by term, and the step megatron's schedule makes
of it (schedule.pipeline). The terms come from a calibration on the machine that runs
(`python -m slime_hydra.calibrate`, loaded with trainer.cost=FILE) or, uncalibrated, from the
FLOPs of the model at trainer.achieved_tflops plus trainer.microbatch_overhead_ms.

A micro-batch of sequences L_1..L_n costs, forward and backward through the whole model on one
model replica of the layout (its tp × cp GPUs; a pipeline stage's model chunk takes 1/(pp·vpp)
of it): token_s · ΣL + square_s · ΣL² + sequence_s · n + microbatch_s (sequence_s: what
attention and the loss pay per packed sequence, e.g. one kernel call each under CP). Each
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
from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.pipeline import PipelineTiming, simulate_pipeline

BACKWARD_SHARE = 2 / 3  # backward costs twice the forward


TERMS = (
    "token_s",
    "square_s",
    "microbatch_s",
    "sequence_s",
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
    if layout.pp == 1:
        pipe = [float(np.sum(rank)) for rank in seconds]
        busy = sum(pipe)
    else:
        timings = [rank_timing(list(rank), layout, cost) for rank in seconds]
        pipe = [t.step_s for t in timings]
        busy = sum(sum(t.busy_s) for t in timings)
    pipe_s = max(pipe)
    bubble = 1 - busy / (len(pipe) * layout.pp * pipe_s) if pipe_s else 0.0
    tail = cost.allreduce_s + cost.optimizer_s
    return StepTiming(pipe_s + tail, bubble, pipe.index(pipe_s), tail)


def rank_timing(seconds: Sequence[float], layout: ParallelLayout, cost: StepCost) -> PipelineTiming:
    """One DP rank's pipeline over micro-batches of these forward+backward `seconds`, in order."""
    forward = [(1 - BACKWARD_SHARE) * s for s in seconds]
    return simulate_pipeline(forward, layout.pp, layout.vpp, layout.vp_group_size, cost.p2p_s)


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


def orders(k: int, seconds: np.ndarray) -> list[np.ndarray]:
    """Orders of a rank's k micro-batches worth trying: as planned, ascending, descending, and
    the smallest at both ends (ascending from the first to the middle, descending after it),
    which shortens the warm-up and cool-down that 1F1B leaves idle."""
    asc = np.argsort(seconds, kind="stable")
    ends = np.empty(k, dtype=np.int64)
    ends[: (k + 1) // 2] = asc[0::2]
    ends[(k + 1) // 2 :] = asc[1::2][::-1]
    return [np.arange(k), asc, asc[::-1], ends]


def fastest_order(
    bin_of: np.ndarray, bin_s: np.ndarray, layout: ParallelLayout, k: int, cost: StepCost
) -> np.ndarray:
    """`bin_of` with each rank's micro-batches (r·k .. r·k + k - 1) reordered to the order its
    pipeline simulates fastest of those `rank_order` tries."""
    if layout.pp == 1:
        return bin_of
    place = np.arange(layout.dp * k)
    for r in range(layout.dp):
        best = rank_order(bin_s[r * k : (r + 1) * k], layout, cost)
        place[r * k + best] = r * k + np.arange(k)
    return place[bin_of]


def rank_order(seconds: np.ndarray, layout: ParallelLayout, cost: StepCost) -> np.ndarray:
    """The fastest of `orders`, then the costliest micro-batch moved to each position in turn
    (k + 4 simulations): where it runs is what the warm-up and cool-down of 1F1B expose. For
    one long micro-batch among equal short ones this is the best order there is (the long
    one's position is all that differs); ties keep the earlier order, so the plan's own order
    stays where nothing is faster."""

    def step_s(order: np.ndarray) -> float:
        return rank_timing(seconds[order].tolist(), layout, cost).step_s

    tried = orders(seconds.size, seconds)
    times = [step_s(o) for o in tried]
    best, best_s = tried[int(np.argmin(times))], min(times)
    top = int(np.argmax(seconds))
    rest = best[best != top]
    for at in range(seconds.size):
        moved = np.insert(rest, at, top)
        moved_s = step_s(moved)
        if moved_s < best_s:
            best, best_s = moved, moved_s
    return best
