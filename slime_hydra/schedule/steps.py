"""Cutting a rollout into optimizer steps without splitting a rollout group across steps."""

from __future__ import annotations

from collections.abc import Sequence

from slime_hydra.errors import SlimeHydraError


def _groups_in_order(group_ids: Sequence[int]) -> list[list[int]]:
    """Sample indices of each group, groups ordered by first appearance."""
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(int(g), []).append(i)
    return list(members.values())


def split_steps(
    group_ids: Sequence[int],
    global_batch_size: int | None,
    step_ids: Sequence[int] | None = None,
) -> list[list[int]]:
    """Global sample indices of each step.

    With `step_ids` (from a trace) the steps are given; otherwise whole groups fill steps of
    `global_batch_size` samples in order. Either way no group straddles two steps.
    """
    if step_ids is not None:
        steps: dict[int, list[int]] = {}
        step_of_group: dict[int, int] = {}
        for i, (g, s) in enumerate(zip(group_ids, step_ids, strict=True)):
            first = step_of_group.setdefault(int(g), int(s))
            if first != s:
                raise SlimeHydraError(
                    f"rollout group {int(g)} has samples in steps {first} and {int(s)} "
                    f"(sample {i}); samples of one group must share a step."
                )
            steps.setdefault(int(s), []).append(i)
        return [steps[s] for s in sorted(steps)]
    n = len(group_ids)
    gbs = n if global_batch_size is None else global_batch_size
    if n % gbs:
        raise SlimeHydraError(
            f"the rollout has {n} samples, not a multiple of batching.global_batch_size={gbs}; "
            "set batching.global_batch_size to a divisor of the rollout size so no sample is "
            "dropped."
        )
    out: list[list[int]] = [[]]
    for members in _groups_in_order(group_ids):
        if len(out[-1]) == gbs:
            out.append([])
        if len(out[-1]) + len(members) > gbs:
            raise SlimeHydraError(
                f"rollout group {int(group_ids[members[0]])} has {len(members)} samples and would "
                f"straddle two steps of batching.global_batch_size={gbs}; set "
                "batching.global_batch_size to a multiple of the group size."
            )
        out[-1].extend(members)
    return out
