"""The pipeline cost model on hand-computed cases."""

from __future__ import annotations

import pytest

from slime_hydra.schedule.pipeline import simulate_pipeline, stage_order


@pytest.mark.parametrize(("pp", "m"), [(1, 4), (2, 4), (2, 8), (4, 8), (4, 16)])
def test_equal_micro_batches_give_the_textbook_1f1b_bubble(pp, m):
    timing = simulate_pipeline([1.0] * m, pp)
    assert timing.bubble_frac == pytest.approx((pp - 1) / (m + pp - 1))
    # (m + p - 1) slots of forward + backward of one stage's share: (1 + 2) / p each.
    assert timing.step_s == pytest.approx((m + pp - 1) * 3 / pp)


def test_a_two_stage_pipeline_by_hand():
    # p=2, m=2, f=1 per stage-chunk (whole-model forward 2): stage 0 runs F0 F1 B0 B1 with B0
    # waiting for stage 1: F0[0,1] F1[1,2] | stage 1: F0[1,2] B0[2,4] F1[4,5] B1[5,7];
    # stage 0: B0[4,6] B1[7,9]. Makespan 9, busy 6 per stage.
    timing = simulate_pipeline([2.0, 2.0], pp=2)
    assert timing.step_s == pytest.approx(9.0)
    assert timing.busy_s == (6.0, 6.0)


def test_interleaving_shrinks_the_bubble():
    plain = simulate_pipeline([1.0] * 8, pp=4)
    interleaved = simulate_pipeline([1.0] * 8, pp=4, vpp=2, group=4)
    assert interleaved.bubble_frac < plain.bubble_frac
    assert sum(interleaved.busy_s) == pytest.approx(sum(plain.busy_s))


def test_one_long_micro_batch_stalls_every_stage():
    even = simulate_pipeline([1.0] * 8, pp=4)
    skewed = simulate_pipeline([0.5] * 4 + [1.5] * 4, pp=4)
    assert skewed.step_s > even.step_s


def test_stage_order_runs_every_op_once_in_megatron_order():
    ops = stage_order(stage=0, pp=2, vpp=2, group=2, num_mb=4)
    assert sorted(ops) == sorted([(k, c, m) for k in "FB" for c in range(2) for m in range(4)])
    # warm-up on stage 0: (p - 1) * 2 + (v - 1) * g = 4 forwards: chunk 0 then chunk 1 of mb 0-1
    assert ops[:4] == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1)]
    assert ops[4:6] == [("F", 0, 2), ("B", 1, 0)]


def test_partial_groups_and_tiny_counts_do_not_deadlock():
    for m in (1, 2, 3, 5):
        timing = simulate_pipeline([1.0] * m, pp=2, vpp=2, group=2)
        assert timing.step_s > 0
