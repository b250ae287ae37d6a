"""The schedule invariants of DESIGN.md as one checker: tests assert it, the trainer enforces it."""

from __future__ import annotations

from collections.abc import Sequence

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
    samples of one group in one step.
    """
    found: list[str] = []
    lengths, cap = schedule.lengths, schedule.cap
    seen: dict[int, int] = {}
    step_of_group: dict[int, int] = {}
    for st in schedule.steps:
        where = f"step {step_number(st.step)}"
        if len(st.ranks) != layout.dp:
            found.append(f"{where}: {len(st.ranks)} DP ranks, expected {layout.dp}")
        counts = {len(rank) for rank in st.ranks}
        if len(counts) > 1:
            found.append(f"{where}: ranks disagree on the micro-batch count: {sorted(counts)}")
        k = st.num_microbatches
        if k % layout.microbatch_alignment:
            found.append(
                f"{where}: {k} micro-batches, not a multiple of {layout.microbatch_alignment}"
            )
        tokens_of = st.microbatch_tokens(lengths)
        for r, rank in enumerate(st.ranks):
            for m, mb in enumerate(rank):
                at = f"{where} rank {r} micro-batch {m}"
                if not mb:
                    found.append(f"{at}: empty")
                tokens = tokens_of[r][m]
                if breaks_cap(len(mb), tokens, cap):
                    found.append(f"{at}: {tokens} tokens over the cap {cap}")
                elif cap is not None and tokens > cap and not allow_oversize:
                    found.append(f"{at}: sample {mb[0]} ({tokens} tokens) over the cap {cap}")
                for i in mb:
                    if i in seen:
                        found.append(f"{at}: sample {i} also in step {seen[i]}")
                    seen[i] = st.step
                    g = int(group_ids[i])
                    first = step_of_group.setdefault(g, st.step)
                    if first != st.step:
                        found.append(f"{at}: group {g} split over steps {first} and {st.step}")
    missing = set(range(len(lengths))) - seen.keys()
    if missing:
        found.append(f"{len(missing)} samples never scheduled, e.g. {min(missing)}")
    return found
