"""Schedule: per optimizer step, per DP rank, micro-batches as lists of global sample indices."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate, chain
from typing import Any

import numpy as np

Microbatch = tuple[int, ...]


def breaks_cap(num_samples: Any, tokens: Any, cap: int | None) -> Any:
    """The cap rule of DESIGN.md, written once: a micro-batch of two or more samples over the
    cap breaks it (a cap violation). A single sample over the cap is not a violation but an
    oversize sample: an error by default, or alone in its micro-batch under oversize=isolate.
    Of ints a bool; of numpy arrays (counts and tokens per micro-batch) a mask."""
    return cap is not None and (num_samples > 1) & (tokens > cap)


def step_number(index: int) -> int:
    """The number users see for the schedule's step `index` (`Schedule.steps` is 0-indexed):
    steps count from 1 in metrics, wandb, the console, checkpoint dirs and trainer.* settings,
    as megatron's iterations do (step k of N; the checkpoint after it is named k)."""
    return index + 1


def step_index(step: int) -> int:
    """The index into `Schedule.steps` of user-facing step number `step` (see step_number)."""
    return step - 1


@dataclass(frozen=True)
class StepSchedule:
    """One optimizer step, held flat (a million samples make one tuple, not a hundred thousand):
    DP rank r has `mbs_per_rank[r]` micro-batches; micro-batch after micro-batch, rank by rank,
    each holds the next `samples_per_mb` entries of `samples` (ascending within it).
    `ranks[r][m]` is micro-batch m of DP rank r."""

    step: int
    mbs_per_rank: tuple[int, ...]
    samples_per_mb: tuple[int, ...]
    samples: tuple[int, ...]
    """Every sample index of the step, in schedule order."""
    plan_ms: float = 0.0

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per DP rank (the count of rank 0; invariants check the others)."""
        return self.mbs_per_rank[0] if self.mbs_per_rank else 0

    @cached_property
    def ranks(self) -> tuple[tuple[Microbatch, ...], ...]:
        """`ranks[r][m]`: the samples of micro-batch m of DP rank r."""
        ends = list(accumulate(self.samples_per_mb))
        mbs = [self.samples[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        last = list(accumulate(self.mbs_per_rank))
        return tuple(tuple(mbs[a:b]) for a, b in zip([0, *last[:-1]], last, strict=True))

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """The samples of each micro-batch as arrays: how many each micro-batch holds (rank by
        rank, micro-batch by micro-batch) and the samples in that order."""
        return np.array(self.samples_per_mb, dtype=np.int64), np.array(self.samples, dtype=np.int64)

    def microbatch_tokens(self, lengths: Sequence[int]) -> list[list[int]]:
        """Tokens of each micro-batch of each DP rank: `tokens[rank][microbatch]`."""
        return [[sum(lengths[i] for i in mb) for mb in rank] for rank in self.ranks]

    @classmethod
    def build(
        cls, step: int, ranks: Sequence[Sequence[Sequence[int]]], plan_ms: float = 0.0
    ) -> StepSchedule:
        """From nested lists (`ranks[r][m]`), sorting each micro-batch's samples for
        determinism."""
        mbs = [sorted(mb) for rank in ranks for mb in rank]
        return cls(
            step=step,
            mbs_per_rank=tuple(len(rank) for rank in ranks),
            samples_per_mb=tuple(len(mb) for mb in mbs),
            samples=tuple(chain.from_iterable(mbs)),
            plan_ms=plan_ms,
        )

    @classmethod
    def of_bins(
        cls, step: int, bin_of: np.ndarray, ids: np.ndarray, dp: int, k: int
    ) -> StepSchedule:
        """Sample ids[j] in micro-batch bin_of[j] (rank r's m-th is bin r·k + m), each
        micro-batch's samples ascending: one sort, no nested lists."""
        span = int(ids.max()) + 1 if ids.size else 1
        members = np.sort(bin_of * span + ids) % span  # by bin, then id
        return cls(
            step=step,
            mbs_per_rank=(k,) * dp,
            samples_per_mb=tuple(np.bincount(bin_of, minlength=dp * k).tolist()),
            samples=tuple(members.tolist()),
        )


@dataclass(frozen=True)
class Schedule:
    """A whole rollout's schedule, with the lengths and token cap it was planned against."""

    lengths: tuple[int, ...]
    cap: int | None
    steps: tuple[StepSchedule, ...]

    def microbatch_tokens(self, step: int) -> list[list[int]]:
        """Tokens of each micro-batch of each DP rank at `step`: `tokens[rank][microbatch]`."""
        return self.steps[step].microbatch_tokens(self.lengths)

    def to_json(self) -> dict[str, Any]:
        """The schedule.json document of DESIGN.md (its steps numbered from 1, as users count)."""
        return {
            "lengths": list(self.lengths),
            "cap": self.cap,
            "steps": [
                {
                    "step": step_number(s.step),
                    "num_microbatches": s.num_microbatches,
                    "ranks": [[list(mb) for mb in rank] for rank in s.ranks],
                }
                for s in self.steps
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Schedule:
        """Read back what `to_json` wrote; ValueError naming the first entry that it could not
        have written (a hand-edited file): lengths that are not counts, a cap that is not a
        positive count, a step without DP ranks, a sample index outside the lengths."""
        lengths, cap = doc["lengths"], doc["cap"]
        if not isinstance(lengths, list) or not all(_is_count(n) for n in lengths):
            raise ValueError("lengths must be a list of non-negative integers")
        if cap is not None and not (_is_count(cap) and cap > 0):
            raise ValueError(f"cap={cap!r} is not a positive integer or null")
        for s in doc["steps"]:
            ranks = s["ranks"]
            if not _is_count(s["step"]):
                raise ValueError(f"step={s['step']!r} is not a step number")
            ok = isinstance(ranks, list) and ranks
            ok = ok and all(isinstance(rank, list) for rank in ranks)
            ok = ok and all(isinstance(mb, list) for rank in ranks for mb in rank)
            if not ok:
                raise ValueError(f"step {s['step']}: ranks must be a non-empty list of lists")
            for i in (i for rank in ranks for mb in rank for i in mb):
                if not (_is_count(i) and i < len(lengths)):
                    raise ValueError(f"step {s['step']}: sample {i!r} is not an index of lengths")
        return cls(
            lengths=tuple(lengths),
            cap=cap,
            steps=tuple(
                StepSchedule.build(step_index(s["step"]), s["ranks"]) for s in doc["steps"]
            ),
        )


def _is_count(value: Any) -> bool:
    """A non-negative int (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
