"""Pipeline cost model: megatron's 1F1B and interleaved 1F1B schedules, replayed call by call.

Each stage runs the sequence of megatron's schedule (schedules.py, configured as the engine
configures it: train/step/model.py): forward and backward steps of its model chunks and, between
them, the exchanges of P2PCommunicator, each of which sends and receives what the schedule hands
it and returns once every one of its transfers has met its peer's, `p2p_s` later. With
variable_seq_lengths every exchange first swaps shapes, blocking (NCCL and gloo sends
rendezvous), even where megatron overlaps the tensors themselves (interleaved 1F1B): so a stage
that has sent waits for its neighbour to reach the matching call, not only for its own inputs.
Replaying measured op times of a pp2 vpp2 CPU run through these calls (3 ms an exchange) gives
its step times within 3%, at 4 and at 64 micro-batches; op-by-op dependencies alone come
out 3-26% short.

A micro-batch's whole-model forward time splits evenly over the pp stages and vpp chunks per
stage; backward costs twice the forward. A DP rank's step is the makespan of its pipeline
(schedule.steptime adds the step's all-reduce and optimizer step and waits for the slowest DP
rank).
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

Op = tuple[str, int, int]  # ("F" | "B", model chunk, micro-batch)


class Exchange(NamedTuple):
    """One blocking P2PCommunicator call: which of the four transfers it carries (next and
    prev are the neighbouring stages, on a ring: the last stage's next is the first)."""

    send_next: bool = False
    recv_prev: bool = False
    send_prev: bool = False
    recv_next: bool = False


Call = Op | Exchange
_NOTHING = Exchange()
Step = tuple[int, int, tuple[int, ...]]


def stage_order(stage: int, pp: int, vpp: int, group: int, num_mb: int) -> list[Op]:
    """Megatron's op order on one stage: warm-up forwards, 1F1B steady state, cool-down."""
    return [c for c in stage_calls(stage, pp, vpp, group, num_mb) if not isinstance(c, Exchange)]


def stage_calls(stage: int, pp: int, vpp: int, group: int, num_mb: int) -> list[Call]:
    """Megatron's ops and exchanges on one stage, in order (calls that carry nothing left out)."""
    if vpp > 1:
        calls = _interleaved_calls(stage, pp, vpp, group, num_mb)
    else:
        calls = _one_f_one_b_calls(stage, pp, num_mb)
    return [c for c in calls if c != _NOTHING]


def _one_f_one_b_calls(stage: int, pp: int, num_mb: int) -> list[Call]:
    """forward_backward_pipelining_without_interleaving: recv_forward, F, send_forward through
    the warm-up; then F, send_forward_recv_backward, B, send_backward_recv_forward; the
    cool-down's recv_backward, B, send_backward."""
    first, last = stage == 0, stage == pp - 1
    warmup = min(pp - stage - 1, num_mb)
    remaining = num_mb - warmup
    calls: list[Call] = []
    for m in range(warmup):
        calls += [Exchange(recv_prev=not first), ("F", 0, m), Exchange(send_next=not last)]
    if remaining:
        calls.append(Exchange(recv_prev=not first))
    for i in range(remaining):
        calls += [("F", 0, warmup + i), Exchange(send_next=not last, recv_next=not last)]
        more = i < remaining - 1
        calls += [("B", 0, i), Exchange(recv_prev=more and not first, send_prev=not first)]
    for m in range(remaining, num_mb):
        calls += [Exchange(recv_next=not last), ("B", 0, m), Exchange(send_prev=not first)]
    return calls


def _interleaved_calls(stage: int, pp: int, vpp: int, group: int, num_mb: int) -> list[Call]:
    """forward_backward_pipelining_with_interleaving as the engine runs it (overlap_p2p_comm):
    virtual micro-batch k is micro-batch table[k] of chunk chunks[k] (groups of `group`
    through every chunk). A forward is followed by an exchange in the forward direction, a
    backward by one in the backward direction; the overlapped tensors travel right after each
    call's shape exchange (variable_seq_lengths), which blocks, so every call meets its peers.
    The first stage receives a chunk's input pp - 1 steps after the last stage sent it, and
    the last stage a gradient likewise."""
    if num_mb % group:
        raise ValueError(
            f"megatron's interleaved schedule runs whole groups of {group} micro-batches "
            f"(microbatch_group_size_per_vp_stage), not {num_mb}"
        )
    first, last = stage == 0, stage == pp - 1
    table = [
        (m, c) for lo in range(0, num_mb, group) for c in range(vpp) for m in range(lo, lo + group)
    ]
    total = len(table)

    def chunk(k: int, forward: bool) -> int:
        c = table[k % total][1]
        return c if forward else vpp - 1 - c

    def op(kind: str, k: int) -> Op:
        return (kind, chunk(k, kind == "F"), table[k][0])

    def receives(k: int, forward: bool) -> bool:
        """megatron's recv_tensor_from_previous_stage(k, forward)."""
        if not (first if forward else last):
            return True
        if k < pp - 1:
            return False
        return chunk(k - (pp - 1), forward) != (vpp - 1 if forward else 0)

    def sends(k: int, forward: bool) -> bool:
        return (
            not (last and chunk(k, True) == vpp - 1)
            if forward
            else not (first and chunk(k, False) == 0)
        )

    warmup = min((pp - stage - 1) * 2 + (vpp - 1) * group, total)
    remaining = total - warmup
    calls: list[Call] = [Exchange(recv_prev=not first)]
    for k in range(warmup):
        calls += [
            op("F", k),
            Exchange(send_next=sends(k, True), recv_prev=receives(k, True) and k != total - 1),
        ]
    if remaining:
        calls.append(Exchange(recv_next=not last))
    for k in range(remaining):
        f = k + warmup
        calls += [
            op("F", f),
            Exchange(send_next=sends(f, True), recv_prev=receives(f, True) and k != remaining - 1),
        ]
        calls += [op("B", k), Exchange(send_prev=sends(k, False), recv_next=receives(k, False))]
    if remaining == 0:
        calls.append(Exchange(recv_next=not last))
    for k in range(remaining, total):
        calls += [
            op("B", k),
            Exchange(send_prev=sends(k, False), recv_next=receives(k, False) and k != total - 1),
        ]
    return calls


@lru_cache(maxsize=256)
def _programs(pp: int, vpp: int, group: int, num_mb: int) -> tuple[tuple[Step, ...], ...]:
    """Every stage's calls as steps (cost factor, micro-batch, transfer keys): an op is
    (1 forward or 2 backward, its micro-batch, ()), an exchange (0, 0, keys). A transfer is the
    i-th on its channel (stage s to its next, or to its prev), sender and receiver sharing i:
    key ^ 1 is the peer's."""
    span = 2 * num_mb * vpp + 2
    counts: dict[tuple[int, int], int] = {}
    programs = []
    for s in range(pp):
        program: list[Step] = []
        for call in stage_calls(s, pp, vpp, group, num_mb):
            if not isinstance(call, Exchange):
                program.append((1 if call[0] == "F" else 2, call[2], ()))
                continue
            keys = []
            for on, channel, side in (
                (call.send_next, 2 * s, 0),
                (call.recv_prev, 2 * ((s - 1) % pp), 1),
                (call.send_prev, 2 * s + 1, 0),
                (call.recv_next, 2 * ((s + 1) % pp) + 1, 1),
            ):
                if on:
                    index = counts.get((channel, side), 0)
                    counts[channel, side] = index + 1
                    keys.append((channel * span + index) * 2 + side)
            program.append((0, 0, tuple(keys)))
        programs.append(tuple(program))
    return tuple(programs)


Event = tuple[int, int, int, tuple[int, ...], tuple[int, ...]]


@lru_cache(maxsize=256)
def _events(pp: int, vpp: int, group: int, num_mb: int) -> tuple[Event, ...]:
    """Every stage's steps in one order in which each exchange comes after its peers have
    reached theirs: (stage, factor, micro-batch, keys, posts), `posts` the keys of the stage's
    next step where that is an exchange (reached, so posted, once this step ends). Whether a
    stage waits depends on the calls alone, never on the times, so one order serves every
    timing."""
    programs = _programs(pp, vpp, group, num_mb)
    reached: set[int] = set()
    cursor = [0] * pp
    events: list[Event] = []
    remaining = sum(len(p) for p in programs)
    while remaining:
        progressed = False
        for s, program in enumerate(programs):
            at = cursor[s]
            while at < len(program):
                factor, mb, keys = program[at]
                reached.update(keys)
                if any(key ^ 1 not in reached for key in keys):
                    break
                after = program[at + 1][2] if at + 1 < len(program) else ()
                events.append((s, factor, mb, keys, after))
                at += 1
            remaining -= at - cursor[s]
            progressed = progressed or at > cursor[s]
            cursor[s] = at
        if not progressed:
            raise RuntimeError(f"pipeline schedule deadlocked (pp={pp}, vpp={vpp}, m={num_mb})")
    return tuple(events)


def simulate_pipelines(
    forward_s: np.ndarray, pp: int, vpp: int = 1, group: int | None = None, p2p_s: float = 0.0
) -> np.ndarray:
    """The makespans of pipelines over micro-batches with the given whole-model forward times
    (`forward_s[w, m]`: micro-batch m of pipeline w; backward = 2 × forward), all at once: each
    stage runs its calls in order, an op for its time, an exchange until every peer of its
    transfers has reached the matching call, plus `p2p_s`."""
    width, num_mb = forward_s.shape
    group = pp if group is None else group
    chunk_f = np.ascontiguousarray(forward_s.T) / (pp * vpp)  # [m] is micro-batch m's row
    first = [program[0][2] if program else () for program in _programs(pp, vpp, group, num_mb)]
    zero = np.zeros(width)
    clock = [zero] * pp
    posted = {key: zero for keys in first for key in keys}
    for s, factor, mb, keys, posts in _events(pp, vpp, group, num_mb):
        if keys:
            now = clock[s]
            for key in keys:
                now = np.maximum(now, posted[key ^ 1])
            clock[s] = now + p2p_s
        else:
            clock[s] = clock[s] + factor * chunk_f[mb]
        for key in posts:
            posted[key] = clock[s]
    return np.max(clock, axis=0)
