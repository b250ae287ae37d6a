"""One step planned for a DP group under a hard token cap: the core both peers' planners share,
with errors in the peers' terms (their argument names, not slime_hydra's config keys)."""

from __future__ import annotations

from collections.abc import Sequence

from slime_hydra.errors import SlimeHydraError
from slime_hydra.planner import plan_rollout
from slime_hydra.schedule import ParallelLayout


def group_layout(dp: int, alignment: int) -> ParallelLayout:
    """A layout whose DP size and micro-batch alignment are `dp` and `alignment`, the only sizes
    the planner reads; pp = vpp group = `alignment` stands in for the pipeline (cp is 1: the
    caller's cap already counts it)."""
    if alignment == 1:
        return ParallelLayout(dp=dp)
    return ParallelLayout(dp=dp, pp=alignment, vpp=2, microbatch_group_size_per_vp_stage=alignment)


def plan_step(
    lengths: Sequence[int], cap: int, dp: int, alignment: int, isolate: bool, caller: str
) -> list[list[list[int]]]:
    """Each DP rank's micro-batches (indices into `lengths`): one count on every rank, a multiple
    of `alignment`, none empty, none of two or more samples over `cap`; a sample over `cap` sits
    alone with `isolate`, else is an error. `caller` names the function in errors."""
    n = len(lengths)
    if cap < 1:
        raise SlimeHydraError(f"{caller}: the token cap {cap} must be a positive integer.")
    if n < dp * alignment:
        raise SlimeHydraError(
            f"{caller}: {n} samples cannot give each of {dp} DP ranks {alignment} non-empty "
            f"micro-batches (the VPP group); pass at least {dp * alignment} samples, or a smaller "
            "DP size or VPP group."
        )
    if not isolate and max(lengths) > cap:
        i = max(range(n), key=lambda j: lengths[j])
        raise SlimeHydraError(
            f"{caller}: sample {i} has {lengths[i]} tokens, over the cap of {cap}; raise the "
            "cap, or drop or truncate the sample."
        )
    oversize = "isolate" if isolate else "error"
    try:
        planned = plan_rollout(lengths, group_layout(dp, alignment), cap, oversize=oversize)
    except SlimeHydraError as exc:
        raise SlimeHydraError(
            f"{caller}: {n} samples cannot fill {dp} DP ranks with one count (a multiple of "
            f"{alignment}) of non-empty micro-batches of at most {cap} tokens; pass more samples, "
            f"or a smaller DP size or VPP group. The planner said: {exc}"
        ) from None
    return planned.microbatches(0)
