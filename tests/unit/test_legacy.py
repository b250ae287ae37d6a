"""The legacy presets are slime's code: slime's golden outputs, hand-checked cases, its crashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.slime_kk import slime_balanced_partitions
from slime_hydra.schedule import (
    DynamicBatching,
    ParallelLayout,
    SlimeLegacyBatching,
    step_metrics,
    violations,
)

VPP2 = ParallelLayout(dp=1, pp=2, vpp=2, microbatch_group_size_per_vp_stage=2)
# 77 schedules produced by running slime's own source at 286750a and 8acc034 (see the .md).
GOLDEN = json.loads((Path(__file__).parents[1] / "data" / "slime_legacy_cases.json").read_text())


def slime_1848(layout: ParallelLayout, cap: int, gbs: int | None = None) -> SlimeLegacyBatching:
    return SlimeLegacyBatching(layout, gbs, cap, "down", False, preset="slime_1848")


def slime_1823(layout: ParallelLayout, cap: int, gbs: int | None = None) -> SlimeLegacyBatching:
    return SlimeLegacyBatching(layout, gbs, cap, "up", True, preset="slime_1823")


def ranks_of(schedule, step=0):
    return [[list(mb) for mb in rank] for rank in schedule.steps[step].ranks]


def tokens(schedule, rank):
    return [sum(schedule.lengths[i] for i in mb) for mb in schedule.steps[0].ranks[rank]]


def metrics(schedule, layout):
    return step_metrics(schedule.steps[0], schedule.lengths, schedule.cap, layout, (1.0, 0.0))


@pytest.mark.parametrize("case", GOLDEN, ids=[c["name"] for c in GOLDEN])
def test_every_golden_case_matches_slime_exactly(case):
    layout = ParallelLayout(
        dp=case["dp"],
        pp=case["pp"],
        vpp=case["vpp"],
        cp=case["cp"],
        microbatch_group_size_per_vp_stage=case["microbatch_group_size_per_vp_stage"],
    )
    up = case["preset"] == "slime_1823"
    strategy = SlimeLegacyBatching(
        layout,
        case["global_batch_size"],
        case["max_tokens_per_gpu"],
        "up" if up else "down",
        up,
        balance_data=case["balance_data"],
        preset=case["preset"],
    )
    lengths = case["lengths"]
    expected = case["expected"]
    if "error" in expected:
        with pytest.raises(SlimeHydraError, match="slime would crash here") as err:
            strategy.plan(lengths, list(range(len(lengths))))
        assert expected["error"] in str(err.value)
        return
    schedule = strategy.plan(lengths, list(range(len(lengths))))
    assert [s.num_microbatches for s in schedule.steps] == expected["num_microbatches"]
    assert [ranks_of(schedule, s) for s in range(len(schedule.steps))] == expected["ranks"]


def test_slime_kk_tie_breaks_by_index_and_orders_parts_heaviest_first():
    # Three 60s and a 10 into 2: the two states of largest spread (60, 60) merge first, the
    # higher index popped first; then 60 (index 0) with 10; then {60(0)},{10} with {60(2)},{60(1)}:
    # 60(0) joins 60(1) (the lighter of the other pair), 10 joins 60(2).
    assert slime_balanced_partitions([60, 60, 60, 10], 2, False) == [[0, 1], [2, 3]]


def test_slime_1848_rounds_down_under_vpp_and_breaks_the_cap():
    # First-fit in order needs 3 bins ([60], [60], [60, 10]); 1848 rounds 3 down to 2, and
    # slime's KK into 2 parts gives {60, 60} = 120 > 100, then {60, 10}.
    lengths = [60, 60, 60, 10]
    schedule = slime_1848(VPP2, 100).plan(lengths, [0, 1, 2, 3])
    assert ranks_of(schedule) == [[[0, 1], [2, 3]]]
    m = metrics(schedule, VPP2)
    assert m["batch/num_microbatches"] == 2
    assert m["batch/cap_violations"] == 1
    assert m["batch/mb_tokens_max"] == 120
    assert any("over the cap" in v for v in violations(schedule, VPP2, [0, 1, 2, 3]))


def test_slime_1823_rounds_up_under_vpp_and_the_default_agrees_on_the_count():
    lengths = [60, 60, 60, 10]
    legacy = slime_1823(VPP2, 100).plan(lengths, [0, 1, 2, 3])
    ours = DynamicBatching(VPP2, None, 100).plan(lengths, [0, 1, 2, 3])
    assert legacy.steps[0].num_microbatches == ours.steps[0].num_microbatches == 4
    assert metrics(legacy, VPP2)["batch/cap_violations"] == 0
    assert violations(ours, VPP2, [0, 1, 2, 3]) == []


def test_slime_1848_clamps_the_rounded_count_to_one():
    # One first-fit bin rounds down to 0 and is clamped to 1: not a multiple of the group.
    schedule = slime_1848(VPP2, 100).plan([10, 10], [0, 1])
    assert schedule.steps[0].num_microbatches == 1
    assert any("not a multiple of 2" in v for v in violations(schedule, VPP2, [0, 1]))


def test_slime_1823_falls_back_to_first_fit_when_kk_breaks_the_cap():
    # First-fit: [6, 6] and [4, 4, 4], 2 bins of 12. KK into 2 splits the 6s and gives
    # {6, 4, 4} = 14 > 12, so 1823 re-packs by first-fit in index order; 1848 keeps the 14.
    lengths = [6, 6, 4, 4, 4]
    one = ParallelLayout(dp=1)
    assert ranks_of(slime_1823(one, 12).plan(lengths, [0] * 5)) == [[[0, 1], [2, 3, 4]]]
    assert sorted(tokens(slime_1848(one, 12).plan(lengths, [0] * 5), 0)) == [10, 14]


def test_slime_1823_crashes_where_a_sample_fits_no_fallback_bin():
    # Rank r takes samples r, r+2, ...: rank 0 = [90, 90, 90, 5] needs 3 first-fit bins,
    # rank 1 = [150, 10, 10, 10] needs 2, so K = 3. KK leaves 150 alone over the cap, and
    # 1823's first-fit fallback finds no bin with room for 150: slime asserts.
    layout = ParallelLayout(dp=2)
    lengths = [90, 150, 90, 10, 90, 10, 5, 10]
    with pytest.raises(SlimeHydraError, match="slime would crash here") as err:
        slime_1823(layout, 100).plan(lengths, list(range(8)))
    assert "This should never happen." in str(err.value)
    assert "DP rank 1" in str(err.value)


def test_slime_1848_keeps_kk_parts_where_1823_crashes():
    layout = ParallelLayout(dp=2)
    lengths = [90, 150, 90, 10, 90, 10, 5, 10]
    schedule = slime_1848(layout, 100).plan(lengths, list(range(8)))
    assert sorted(tokens(schedule, 1)) == [10, 20, 150]
    assert metrics(schedule, layout)["batch/empty_microbatches"] == 0


def test_slime_1823_crashes_when_rounding_up_asks_more_parts_than_samples():
    # Three samples of 30 need 3 bins of 40; the VPP group of 4 rounds K up to 4 > 3 samples.
    layout = ParallelLayout(dp=1, pp=2, vpp=2, microbatch_group_size_per_vp_stage=4)
    with pytest.raises(SlimeHydraError, match="number of items:\\[3\\] < k_partitions:\\[4\\]"):
        slime_1823(layout, 40).plan([30, 30, 30], [0, 1, 2])


def test_the_dp_split_covers_the_whole_rollout_then_each_rank_cuts_steps():
    # dp=2, global batch 4: rank 0 takes samples 0, 2, 4, 6 and rank 1 takes 1, 3, 5, 7 of the
    # whole rollout; each rank's steps are its first two samples, then its next two.
    layout = ParallelLayout(dp=2)
    schedule = slime_1848(layout, 1000, gbs=4).plan([5] * 8, list(range(8)))
    steps = [
        sorted(sorted(i for mb in rank for i in mb) for rank in st.ranks) for st in schedule.steps
    ]
    assert steps == [[[0, 2], [1, 3]], [[4, 6], [5, 7]]]


def test_balance_data_splits_the_whole_rollout_by_equal_count_kk():
    layout = ParallelLayout(dp=2)
    lengths = [100, 90, 10, 5]  # i mod 2 would give {100, 10} and {90, 5}
    strategy = SlimeLegacyBatching(layout, None, 1000, "down", False, balance_data=True)
    rank_sets = [
        sorted(i for mb in rank for i in mb)
        for rank in strategy.plan(lengths, [0] * 4).steps[0].ranks
    ]
    assert rank_sets == [[0, 3], [1, 2]]


def test_a_rollout_that_does_not_fill_whole_steps_on_every_rank_is_slimes_crash():
    with pytest.raises(SlimeHydraError, match="slime would crash here"):
        slime_1848(ParallelLayout(dp=2), 1000, gbs=2).plan([5] * 5, list(range(5)))
