"""Pipeline cost model for `trainer=plan`: simulated 1F1B (and interleaved 1F1B with VPP).

A micro-batch's whole-model forward time splits evenly over the pp stages and vpp chunks per
stage; backward costs twice the forward; an activation or gradient crossing to another stage
costs `p2p_s`. A DP rank's step is the makespan of its pipeline (schedule.steptime adds the
step's all-reduce and optimizer step and waits for the slowest DP rank).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Op = tuple[str, int, int]  # ("F" | "B", model chunk, micro-batch)


@dataclass(frozen=True)
class PipelineTiming:
    """One DP rank's simulated step: makespan and the busy time of each pipeline stage."""

    step_s: float
    busy_s: tuple[float, ...]

    @property
    def bubble_frac(self) -> float:
        """Idle share of the stages over the makespan."""
        if self.step_s == 0:
            return 0.0
        return 1 - sum(self.busy_s) / (len(self.busy_s) * self.step_s)


def stage_order(stage: int, pp: int, vpp: int, group: int, num_mb: int) -> list[Op]:
    """Megatron's op order on one stage: warm-up forwards, 1F1B steady state, cool-down.

    With vpp > 1 micro-batches go through the chunks in groups of `group` (megatron's
    microbatch_group_size_per_vp_stage): forwards chunk 0..v-1, backwards chunk v-1..0.
    """
    forwards = [
        (c, m)
        for start in range(0, num_mb, group)
        for c in range(vpp)
        for m in range(start, min(start + group, num_mb))
    ]
    backwards = [(vpp - 1 - c, m) for c, m in forwards]
    warmup = (pp - stage - 1) * 2 + (vpp - 1) * group if vpp > 1 else pp - stage - 1
    warmup = min(warmup, len(forwards))
    ops: list[Op] = [("F", *f) for f in forwards[:warmup]]
    for f, b in zip(forwards[warmup:], backwards, strict=False):
        ops += [("F", *f), ("B", *b)]
    ops += [("B", *b) for b in backwards[len(forwards) - warmup :]]
    return ops


def simulate_pipeline(
    forward_s: Sequence[float],
    pp: int,
    vpp: int = 1,
    group: int | None = None,
    p2p_s: float = 0.0,
) -> PipelineTiming:
    """Simulate one DP rank's pipeline over micro-batches with the given whole-model forward
    times (backward = 2 × forward), each op starting once its stage is free and its input
    (the previous stage's forward, the next stage's backward) is done and, from another stage,
    sent (`p2p_s`)."""
    num_mb = len(forward_s)
    group = pp if group is None else group
    chunk_f = [f / (pp * vpp) for f in forward_s]
    orders = [stage_order(s, pp, vpp, group, num_mb) for s in range(pp)]
    done: dict[tuple[str, int, int, int], float] = {}
    cursor = [0] * pp
    clock = [0.0] * pp
    busy = [0.0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(pp):
            while cursor[s] < len(orders[s]):
                kind, c, m = orders[s][cursor[s]]
                dep = _dependency(kind, s, c, m, pp, vpp)
                if dep is not None and dep not in done:
                    break
                cost = chunk_f[m] * (1 if kind == "F" else 2)
                ready = 0.0 if dep is None else done[dep] + (p2p_s if dep[1] != s else 0.0)
                start = max(clock[s], ready)
                clock[s] = start + cost
                busy[s] += cost
                done[(kind, s, c, m)] = clock[s]
                cursor[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"pipeline schedule deadlocked (pp={pp}, vpp={vpp}, m={num_mb})")
    return PipelineTiming(step_s=max(clock), busy_s=tuple(busy))


def _dependency(
    kind: str, stage: int, chunk: int, mb: int, pp: int, vpp: int
) -> tuple[str, int, int, int] | None:
    """The op whose output this op consumes, or None for the very first forward."""
    if kind == "F":
        if stage > 0:
            return ("F", stage - 1, chunk, mb)
        return ("F", pp - 1, chunk - 1, mb) if chunk > 0 else None
    if stage < pp - 1:
        return ("B", stage + 1, chunk, mb)
    if chunk < vpp - 1:
        return ("B", 0, chunk + 1, mb)
    return ("F", stage, chunk, mb)
