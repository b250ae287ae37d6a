"""The legacy presets do what slime did, hand-checked, and the metrics report their faults."""

from __future__ import annotations

from slime_hydra.schedule import (
    DynamicBatching,
    ParallelLayout,
    SlimeLegacyBatching,
    step_metrics,
    violations,
)

VPP2 = ParallelLayout(dp=1, pp=2, vpp=2, microbatch_group_size_per_vp_stage=2)


def slime_1848(layout: ParallelLayout, cap: int) -> SlimeLegacyBatching:
    return SlimeLegacyBatching(layout, None, cap, "down", False, preset="slime_1848")


def slime_1823(layout: ParallelLayout, cap: int) -> SlimeLegacyBatching:
    return SlimeLegacyBatching(layout, None, cap, "up", True, preset="slime_1823")


def ranks_of(schedule):
    return [[list(mb) for mb in rank] for rank in schedule.steps[0].ranks]


def tokens(schedule, rank):
    return [sum(schedule.lengths[i] for i in mb) for mb in schedule.steps[0].ranks[rank]]


def metrics(schedule, layout):
    return step_metrics(schedule.steps[0], schedule.lengths, schedule.cap, layout, (1.0, 0.0))


def test_slime_1848_rounds_down_under_vpp_and_breaks_the_cap():
    # First-fit in order needs 3 bins ([60], [60], [60, 10]); 1848 rounds 3 down to 2, and
    # KK into 2 parts gives {60, 60} = 120 > 100 and {60, 10}.
    lengths = [60, 60, 60, 10]
    schedule = slime_1848(VPP2, 100).plan(lengths, [0, 1, 2, 3])
    assert sorted(tokens(schedule, 0)) == [70, 120]
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


def test_slime_1823_fallback_leaves_a_trailing_empty_micro_batch():
    # Sample i goes to rank i mod 2: rank 0 = [90, 90, 90, 5] needs 3 first-fit bins,
    # rank 1 = [150, 10, 10, 10] needs 2, so K = 3. KK puts 150 alone in a part over the cap,
    # so 1823 re-packs rank 1 by first-fit into exactly 3 bins: [150], [10, 10, 10], [] (#1838).
    layout = ParallelLayout(dp=2)
    lengths = [90, 150, 90, 10, 90, 10, 5, 10]
    schedule = slime_1823(layout, 100).plan(lengths, list(range(8)))
    assert ranks_of(schedule)[1] == [[1], [3, 5, 7], []]
    m = metrics(schedule, layout)
    assert m["batch/empty_microbatches"] == 1
    assert m["batch/oversize_samples"] == 1
    assert m["batch/num_microbatches"] == 3
    assert any("empty" in v for v in violations(schedule, layout, list(range(8))))


def test_slime_1848_keeps_kk_parts_where_1823_falls_back():
    layout = ParallelLayout(dp=2)
    lengths = [90, 150, 90, 10, 90, 10, 5, 10]
    schedule = slime_1848(layout, 100).plan(lengths, list(range(8)))
    assert sorted(tokens(schedule, 1)) == [10, 20, 150]
    assert metrics(schedule, layout)["batch/empty_microbatches"] == 0


def test_a_rank_with_fewer_samples_than_k_gets_empty_kk_parts():
    # Rank 0 = [90, 90, 90] needs 3 bins; rank 1 = [10, 10] has only 2 samples for K = 3.
    layout = ParallelLayout(dp=2)
    lengths = [90, 10, 90, 10, 90]
    schedule = slime_1848(layout, 100).plan(lengths, list(range(5)))
    assert metrics(schedule, layout)["batch/empty_microbatches"] == 1


def test_balance_data_splits_ranks_by_equal_count_kk():
    layout = ParallelLayout(dp=2)
    lengths = [100, 90, 10, 5]  # i mod 2 would give {100, 10} and {90, 5}
    strategy = SlimeLegacyBatching(layout, None, 1000, "down", False, balance_data=True)
    rank_sets = [
        sorted(i for mb in rank for i in mb)
        for rank in strategy.plan(lengths, [0] * 4).steps[0].ranks
    ]
    assert sorted(rank_sets) == [[0, 3], [1, 2]]
