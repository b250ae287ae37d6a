"""The schedule invariants of DESIGN.md as one checker: tests assert it, the trainer enforces it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from slime_hydra.schedule.layout import ParallelLayout
from slime_hydra.schedule.schedule import Schedule, breaks_cap, step_number


def violations(
    schedule: Schedule,
    layout: ParallelLayout,
    group_ids: Sequence[int],
    allow_oversize: bool = False,
) -> list[str]:
    """Every way `schedule` breaks an invariant, one readable line each (empty when sound).

    Checks: each sample exactly once over all steps; the same micro-batch count on every DP
    rank; that count a multiple of the VPP alignment; no empty micro-batch; multi-sample
    micro-batches within the cap; a sample over the cap only when allowed, and then alone;
    samples of one group in one step. numpy over all samples; Python only for what it reports.
    """
    found: list[str] = []
    lengths = np.asarray(schedule.lengths, dtype=np.int64)
    groups = np.asarray(group_ids, dtype=np.int64)
    cap = schedule.cap
    place: list[tuple[int, int, int]] = []  # (step, rank, micro-batch) of each, in order
    counts_of: list[np.ndarray] = []
    members: list[np.ndarray] = []
    for st in schedule.steps:
        at = f"step {step_number(st.step)}"
        if len(st.mbs_per_rank) != layout.dp:
            found.append(f"{at}: {len(st.mbs_per_rank)} DP ranks, expected {layout.dp}")
        ks = set(st.mbs_per_rank)
        if len(ks) > 1:
            found.append(f"{at}: ranks disagree on the micro-batch count: {sorted(ks)}")
        k = st.num_microbatches
        if k % layout.microbatch_alignment:
            found.append(
                f"{at}: {k} micro-batches, not a multiple of {layout.microbatch_alignment}"
            )
        counts, samples = st.flat()
        counts_of.append(counts)
        members.append(samples)
        place.extend((st.step, r, m) for r, k_r in enumerate(st.mbs_per_rank) for m in range(k_r))
    counts = np.concatenate(counts_of) if counts_of else np.zeros(0, dtype=np.int64)
    samples = np.concatenate(members) if members else np.zeros(0, dtype=np.int64)
    mb_of = np.repeat(np.arange(counts.size), counts)
    step_of_mb = np.fromiter((p[0] for p in place), dtype=np.int64, count=len(place))

    def where(m: int) -> str:
        step, r, k = place[m]
        return f"step {step_number(step)} rank {r} micro-batch {k}"

    tokens = np.bincount(mb_of, weights=lengths[samples], minlength=counts.size).astype(np.int64)
    firsts = np.cumsum(counts) - counts
    for m in np.flatnonzero(counts == 0).tolist():
        found.append(f"{where(m)}: empty")
    if cap is not None:
        for m in np.flatnonzero(breaks_cap(counts, tokens, cap)).tolist():
            found.append(f"{where(m)}: {int(tokens[m])} tokens over the cap {cap}")
        if not allow_oversize:
            for m in np.flatnonzero((counts == 1) & (tokens > cap)).tolist():
                sample = int(samples[firsts[m]])
                found.append(
                    f"{where(m)}: sample {sample} ({int(tokens[m])} tokens) over the cap {cap}"
                )
    step_of = step_of_mb[mb_of]  # of each occurrence
    _, first_at = np.unique(samples, return_index=True)
    again = np.ones(samples.size, dtype=bool)
    again[first_at] = False
    first_step = np.full(lengths.size, -1, dtype=np.int64)
    first_step[samples[first_at]] = step_of[first_at]
    for o in np.flatnonzero(again).tolist():
        i = int(samples[o])
        found.append(
            f"{where(int(mb_of[o]))}: sample {i} also in step {step_number(int(first_step[i]))}"
        )
    group_of = groups[samples]
    _, group_first, group_at = np.unique(group_of, return_index=True, return_inverse=True)
    group_step = step_of[group_first]
    for o in np.flatnonzero(step_of != group_step[group_at]).tolist():
        found.append(
            f"{where(int(mb_of[o]))}: group {int(group_of[o])} split over steps "
            f"{step_number(int(group_step[group_at[o]]))} and {step_number(int(step_of[o]))}"
        )
    missing = np.setdiff1d(np.arange(lengths.size), samples)
    if missing.size:
        found.append(f"{missing.size} samples never scheduled, e.g. {int(missing[0])}")
    return found
