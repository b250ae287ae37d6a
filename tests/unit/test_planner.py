"""The planning API (slime_hydra.planner) on hand-computed rollouts: steps, counts, metrics."""

from __future__ import annotations

import gc

import pytest

from slime_hydra.errors import SlimeHydraError
from slime_hydra.planner import plan_rollout, run_strategy
from slime_hydra.schedule import FixedBatching, ParallelLayout


def test_groups_fill_steps_and_every_rank_gets_one_count() -> None:
    # Groups {0,1} {2,3} | {4,5} {6,7}; step 1: four 5s under cap 10 on 2 ranks → one {5,5}
    # each; step 2: four 2s → one {2,2} each.
    planned = plan_rollout(
        [5, 5, 5, 5, 2, 2, 2, 2],
        ParallelLayout(dp=2),
        10,
        group_ids=[0, 0, 1, 1, 2, 2, 3, 3],
        global_batch_size=4,
    )
    assert planned.num_microbatches == [1, 1]
    for step, samples in ((0, {0, 1, 2, 3}), (1, {4, 5, 6, 7})):
        ranks = planned.microbatches(step)
        assert [len(rank) for rank in ranks] == [1, 1]
        assert {i for rank in ranks for mb in rank for i in mb} == samples
    first, second = planned.metrics
    assert first["batch/mb_tokens_max"] == 10 and first["batch/cap_utilization"] == 1.0
    assert second["batch/mb_tokens_max"] == 4 and second["batch/cap_utilization"] == 0.4
    assert planned.violations == ()


def test_step_ids_give_the_steps() -> None:
    planned = plan_rollout([3, 3, 3, 3], ParallelLayout(dp=1), 6, step_ids=[1, 0, 1, 0])
    assert [planned.microbatches(s) for s in (0, 1)] == [[[[1, 3]]], [[[0, 2]]]]


def test_the_cap_is_max_tokens_per_gpu_times_cp() -> None:
    # cap 4 × 2 = 8: [5, 3, 5, 3] fits two micro-batches of 8 on one rank.
    planned = plan_rollout([5, 3, 5, 3], ParallelLayout(cp=2), 4)
    assert planned.schedule.cap == 8
    lengths = planned.schedule.lengths
    assert [sum(lengths[i] for i in mb) for mb in planned.microbatches(0)[0]] == [8, 8]


def test_vpp_rounds_the_count_up_to_the_group() -> None:
    # [6, 6, 6, 2] under 8: three micro-batches at least, four with a VPP group of 2.
    layout = ParallelLayout(pp=2, vpp=2, microbatch_group_size_per_vp_stage=2)
    planned = plan_rollout([6, 6, 6, 2], layout, 8)
    assert planned.num_microbatches == [4]
    assert planned.metrics[0]["batch/num_microbatches_lb"] == 4


def test_flops_metrics_count_tokens_without_a_model() -> None:
    # One rank, micro-batches {4} and {2, 2}: tokens 4 and 4, FLOPs under L² 16 and 8.
    lengths, layout = [4, 2, 2], ParallelLayout()
    tokens = plan_rollout(lengths, layout, 4).metrics[0]
    assert tokens["batch/token_imbalance"] == tokens["batch/flops_imbalance"] == 1.0
    squared = plan_rollout(lengths, layout, 4, flops_coefficients=(0.0, 1.0)).metrics[0]
    assert squared["batch/flops_imbalance"] == pytest.approx(16 / 12)


def test_any_strategy_is_measured_and_checked() -> None:
    # Fixed batching, two samples per micro-batch, balanced by KK: {6, 1} and {6, 6} = 12 > 8.
    strategy = FixedBatching(ParallelLayout(), 4, 2, max_tokens_per_gpu=8)
    planned = run_strategy(strategy, [6, 6, 6, 1])
    assert planned.metrics[0]["batch/cap_violations"] == 1
    assert len(planned.violations) == 1 and "12 tokens over the cap 8" in planned.violations[0]


def test_an_oversize_sample_is_an_error_or_alone() -> None:
    with pytest.raises(SlimeHydraError, match="sample 0 has 9 tokens"):
        plan_rollout([9, 1], ParallelLayout(), 8)
    planned = plan_rollout([9, 1], ParallelLayout(), 8, oversize="isolate")
    assert sorted(planned.microbatches(0)[0]) == [[0], [1]]
    assert planned.metrics[0]["batch/oversize_samples"] == 1


@pytest.mark.parametrize("enabled", [True, False])
def test_a_plan_leaves_the_cycle_collector_as_it_found_it(enabled: bool) -> None:
    # The collector is paused while a plan builds its lists; a refused plan (4 samples on
    # dp=8) must not leave it off, nor turn it on where the caller had it off.
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        plan_rollout([5, 5, 5, 5], ParallelLayout(dp=1), 10)
        assert gc.isenabled() is enabled
        with pytest.raises(SlimeHydraError):
            plan_rollout([5, 5, 5, 5], ParallelLayout(dp=8), 10)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
