"""benchmarks/bench_planner.py runs end to end on a small draw: every section prints, and the
drawn cases keep every invariant."""

from __future__ import annotations

import re

import pytest

from benchmarks import bench_planner
from slime_hydra.schedule import StepSchedule
from tests.families import FAMILIES


def test_a_small_run_prints_every_section_and_breaks_no_invariant(capsys):
    # Seed 7's cases take ~1 s; steps above K_lb send the run to the count oracle and the LP
    # (seed 5: 15-25 s).
    args = ["--seed", "7", "--cases", "4", "--repeats", "1", "--draws", "1", "--near-full", "1"]
    assert bench_planner.main([*args, "--target-draws", "1", "--no-curve"]) == 0
    out = capsys.readouterr().out
    assert "seed 7 (rerun with --seed 7)" in out
    assert re.search(r"all cases: 0 broken invariants", out)
    for section in ("seed sweep", "target steps", "near-full steps"):
        assert section in out
    # The near-full steps' mean plan time, what a run pays a step, beside the median.
    assert re.search(r"plan median [\d.]+ ms, mean [\d.]+ ms \(what a run pays", out)
    targets = re.findall(r"^\s+(4096|16384)\s+32 (\w+)", out, flags=re.MULTILINE)
    assert sorted(targets) == sorted((n, f) for n in ("16384", "4096") for f in FAMILIES)


@pytest.mark.parametrize(
    ("lengths", "cap", "bound"),
    [
        # 12.5 tokens a rank on average, but the rank holding the 20 holds one more sample:
        # at least 20 + 1.
        ([20, 1, 2, 1, 1], 100, 21),
        # 22.5 a rank, and two parts of the samples can be 24 and 21 ({15, 9}, {10, 10, 1}).
        # But the rank without the over-cap 15 holds two micro-batches of at most 10: the
        # rank with it holds the other 25 or more.
        ([15, 10, 10, 9, 1], 10, 25),
    ],
)
def test_the_rank_bound_on_a_plan_that_reaches_it(lengths, cap, bound):
    # dp=2, K=2: micro-batches [0] [1] | [2] [3, 4].
    step = StepSchedule(
        step=0, mbs_per_rank=(2, 2), samples_per_mb=(1, 1, 1, 2), samples=(0, 1, 2, 3, 4)
    )
    assert bench_planner.rank_lower_bound(step, lengths, cap) == bound
    assert bench_planner.heaviest_rank(step, lengths) == bound
