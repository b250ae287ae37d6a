"""Every batch/* and sim/* value on small hand-computed cases (the arithmetic is in the comments).

A metric that is only checked for presence or range lets a wrong formula through; each key of
tests/contract.py is pinned here to the number worked out by hand.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slime_hydra.schedule import ParallelLayout, Schedule, StepSchedule, step_metrics
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.schedule.steptime import StepCost
from slime_hydra.train.job import plan_steps
from slime_hydra.train.run.plan import simulate
from slime_hydra.train.settings import PlanTrainer
from tests.contract import BATCH_KEYS, SIM_KEYS

LINEAR = (1.0, 0.0)  # cost = tokens
SQUARE = (0.0, 1.0)  # cost = L² per sequence

# Case A: dp=2, cap 10, lengths [6, 3, 3, 4, 2, 1].
# rank 0: {0} = 6 tokens, {1, 2} = 3 + 3 = 6;  rank 1: {3} = 4, {4, 5} = 2 + 1 = 3.
A_LENGTHS = [6, 3, 3, 4, 2, 1]
A_STEP = StepSchedule.build(0, [[[0], [1, 2]], [[3], [4, 5]]], plan_ms=1.5)


def test_every_batch_key_of_the_contract_is_computed():
    m = step_metrics(A_STEP, A_LENGTHS, 10, ParallelLayout(dp=2), LINEAR)
    assert set(m) == set(BATCH_KEYS)


def test_batch_metrics_by_hand_with_a_cap():
    m = step_metrics(A_STEP, A_LENGTHS, 10, ParallelLayout(dp=2), SQUARE)
    # micro-batch tokens [6, 6, 4, 3]: sum 19, mean 19/4 = 4.75, max 6, min 3.
    assert m["batch/num_microbatches"] == 2
    assert m["batch/mb_tokens_max"] == 6
    assert m["batch/mb_tokens_mean"] == pytest.approx(4.75)
    assert m["batch/mb_tokens_min"] == 3
    assert m["batch/token_imbalance"] == pytest.approx(6 / 4.75)  # 1.263...
    # rank tokens 6 + 6 = 12 and 4 + 3 = 7: mean 9.5.
    assert m["batch/dp_token_imbalance"] == pytest.approx(12 / 9.5)  # 1.263...
    # L² per sequence: micro-batches 36, 9 + 9 = 18, 16, 4 + 1 = 5: sum 75, mean 18.75.
    assert m["batch/flops_imbalance"] == pytest.approx(36 / 18.75)  # 1.92
    # ranks 36 + 18 = 54 and 16 + 5 = 21: mean 37.5.
    assert m["batch/dp_flops_imbalance"] == pytest.approx(54 / 37.5)  # 1.44
    # 19 tokens over 4 micro-batches × cap 10 = 40 slots.
    assert m["batch/cap_utilization"] == pytest.approx(19 / 40)  # 0.475
    # Bound on the count: tokens ⌈19/10⌉ = 2, samples over cap/2 (the 6) = 1; max 2 over
    # dp=2 ranks: ⌈2/2⌉ = 1, alignment 1.
    assert m["batch/num_microbatches_lb"] == 1
    # Bound on the largest of 4 micro-batches: max(largest sample 6, ⌈19/4⌉ = 5) = 6.
    assert m["batch/mb_tokens_lb"] == 6
    assert m["batch/cap_violations"] == 0
    assert m["batch/empty_microbatches"] == 0
    assert m["batch/oversize_samples"] == 0
    assert m["batch/plan_ms"] == 1.5


def test_linear_flops_imbalance_equals_token_imbalance():
    # Cost a·L with b = 0 is proportional to tokens: 6/4.75 and 12/9.5 again.
    m = step_metrics(A_STEP, A_LENGTHS, 10, ParallelLayout(dp=2), (2.0, 0.0))
    assert m["batch/flops_imbalance"] == pytest.approx(6 / 4.75)
    assert m["batch/dp_flops_imbalance"] == pytest.approx(12 / 9.5)


def test_violations_oversize_and_empty_micro_batches_by_hand():
    # dp=1, cap 10, lengths [12, 7, 5, 2]; micro-batches {0} = 12 (one sample over the cap:
    # oversize, not a violation), {1, 2} = 7 + 5 = 12 (two samples over the cap: a violation),
    # {3} = 2, {} = 0 (empty).
    lengths = [12, 7, 5, 2]
    step = StepSchedule.build(0, [[[0], [1, 2], [3], []]])
    m = step_metrics(step, lengths, 10, ParallelLayout(), LINEAR)
    assert m["batch/num_microbatches"] == 4
    assert m["batch/cap_violations"] == 1
    assert m["batch/oversize_samples"] == 1
    assert m["batch/empty_microbatches"] == 1
    # tokens [12, 12, 2, 0]: sum 26, mean 6.5, min 0 (the empty one).
    assert m["batch/mb_tokens_max"] == 12
    assert m["batch/mb_tokens_min"] == 0
    assert m["batch/mb_tokens_mean"] == pytest.approx(6.5)
    assert m["batch/token_imbalance"] == pytest.approx(12 / 6.5)
    assert m["batch/dp_token_imbalance"] == pytest.approx(1.0)  # one rank: max = mean
    assert m["batch/cap_utilization"] == pytest.approx(26 / 40)  # 0.65
    # Count bound: the 12 alone (1) + ⌈(7 + 5 + 2)/10⌉ = 2 → 3; over cap/2: 12 and 7 → 2;
    # max 3 on one rank.
    assert m["batch/num_microbatches_lb"] == 3
    # Largest-part bound over 4 parts: max(12, ⌈26/4⌉ = 7) = 12.
    assert m["batch/mb_tokens_lb"] == 12


def test_the_count_bound_rounds_up_to_the_vpp_group():
    # dp=2, pp=2, vpp=2, group 2; four samples of 3 under cap 10: ⌈12/10⌉ = 2 micro-batches
    # over 2 ranks → 1 per rank, rounded up to the group of 2.
    layout = ParallelLayout(dp=2, pp=2, vpp=2, microbatch_group_size_per_vp_stage=2)
    step = StepSchedule.build(0, [[[0], [1]], [[2], [3]]])
    m = step_metrics(step, [3, 3, 3, 3], 10, layout, LINEAR)
    assert m["batch/num_microbatches_lb"] == 2
    # tokens [3, 3, 3, 3]: a perfect balance, 12 of 4 × 10 slots used.
    assert m["batch/token_imbalance"] == pytest.approx(1.0)
    assert m["batch/cap_utilization"] == pytest.approx(0.3)


def test_the_count_bound_is_the_planners_bin_bound():
    # cap 10, lengths [6, 6, 6, 5, 5]: ⌈28/10⌉ = 3 and three samples over 5 say 3, but a 6 and
    # a 5 never share a micro-batch (11 > 10), so the 6s sit alone and the 5s take a fourth
    # (Martello-Toth's L2 at a = 5). The planner plans K = 4 and logs the bound it proved.
    step = StepSchedule.build(0, [[[0], [1], [2], [3, 4]]])
    m = step_metrics(step, [6, 6, 6, 5, 5], 10, ParallelLayout(dp=1), LINEAR)
    assert m["batch/num_microbatches_lb"] == 4 == m["batch/num_microbatches"]
    # Over dp=2 the 4 micro-batches need 2 per rank; a sample over the cap adds one.
    two = StepSchedule.build(
        0,
        [
            [[0], [3, 4]],
            [[1], [2]],
        ],
    )
    assert (
        step_metrics(two, [6, 6, 6, 5, 5], 10, ParallelLayout(dp=2), LINEAR)[
            "batch/num_microbatches_lb"
        ]
        == 2
    )
    big = StepSchedule.build(0, [[[0], [3, 4], [5]], [[1], [2], []]])
    lengths = [6, 6, 6, 5, 5, 30]
    assert (
        step_metrics(big, lengths, 10, ParallelLayout(dp=2), LINEAR)["batch/num_microbatches_lb"]
        == 3
    )


def test_without_a_cap_the_cap_metrics_are_neutral():
    m = step_metrics(A_STEP, A_LENGTHS, None, ParallelLayout(dp=2), LINEAR)
    # No cap: the count bound is the count itself, nothing is over a cap, no utilization.
    assert m["batch/num_microbatches_lb"] == 2
    assert m["batch/cap_utilization"] is None
    assert m["batch/cap_violations"] == 0
    assert m["batch/oversize_samples"] == 0
    assert m["batch/mb_tokens_min"] == 3


def plan_job(lengths, ranks, layout, coefficients, trainer=None):
    """What plan mode's simulate reads of a Job: the layout, the schedule, the step cost model
    (analytic, of `trainer`'s speed), the model's dims (for memory) and the planned steps."""
    trainer = trainer or ONE_TFLOPS
    schedule = Schedule(tuple(lengths), None, (StepSchedule.build(0, ranks),))
    cost = StepCost.analytic(
        coefficients, trainer.achieved_tflops, trainer.microbatch_overhead_ms, layout
    )
    planned = plan_steps(schedule, layout, DIMS, cost)
    return SimpleNamespace(layout=layout, schedule=schedule, cost=cost, dims=DIMS, planned=planned)


# 1 TFLOP/s per GPU and 3e12 FLOPs per token (forward + backward): a micro-batch's whole-model
# forward takes tokens / (tp × cp) seconds (forward = 1/3 of 3e12 × tokens, over tp × cp GPUs).
ONE_TFLOPS = PlanTrainer(achieved_tflops=1.0, microbatch_overhead_ms=0.0)
PER_TOKEN = (3e12, 0.0)
# The memory model's dims; sim/peak_memory_gib is worked out by hand in test_memory.py.
DIMS = ModelDims("toy", 4, 8, 16, 2, 1, 32, 64)


def test_sim_values_by_hand_dp2_tp2():
    # Case A's ranks on tp=2: forwards 6/2 = 3 and 3 (rank 0), 4/2 = 2 and 3/2 = 1.5 (rank 1).
    # pp=1: a rank's step is forward + backward (2×) of every micro-batch:
    # rank 0: 3 × (3 + 3) = 18 s; rank 1: 3 × (2 + 1.5) = 10.5 s. The step waits for rank 0.
    job = plan_job(A_LENGTHS, A_STEP.ranks, ParallelLayout(dp=2, tp=2), PER_TOKEN)
    sim = simulate(ONE_TFLOPS, job, job.schedule.steps[0])
    assert set(SIM_KEYS) <= set(sim)
    assert sim["sim/step_s"] == pytest.approx(18.0)
    # busy 18 + 10.5 = 28.5 of 2 ranks × 1 stage × 18 s = 36: idle 7.5/36.
    assert sim["sim/bubble_frac"] == pytest.approx(7.5 / 36)
    assert sim["sim/peak_tokens"] == 6  # the largest micro-batch, cp=1
    assert sim["sim/slowest_dp_rank"] == 0


def test_sim_overhead_adds_a_third_per_forward():
    # microbatch_overhead_ms=3000: 3 s per micro-batch forward+backward, 1 s of it in the
    # forward. rank 0: 3 × ((3 + 1) + (3 + 1)) = 24 s; rank 1: 3 × (3 + 2.5) = 16.5 s.
    trainer = PlanTrainer(achieved_tflops=1.0, microbatch_overhead_ms=3000.0)
    job = plan_job(A_LENGTHS, A_STEP.ranks, ParallelLayout(dp=2, tp=2), PER_TOKEN, trainer)
    sim = simulate(trainer, job, job.schedule.steps[0])
    assert sim["sim/step_s"] == pytest.approx(24.0)
    assert sim["sim/bubble_frac"] == pytest.approx(1 - (24 + 16.5) / 48)


def test_sim_values_by_hand_pp2_cp2():
    # dp=1, pp=2, cp=2, micro-batches of 8 and 4 tokens: whole-model forwards 8/2 = 4 and
    # 4/2 = 2, per stage 2 and 1 (backward twice that).
    # stage 0: F0 [0,2] F1 [2,3] ... B0 waits for stage 1's B0.
    # stage 1: F0 [2,4] B0 [4,8] F1 [8,9] B1 [9,11].
    # stage 0: B0 [8,12] B1 [12,14] (stage 1's B1 done at 11). Makespan 14.
    # busy 2 + 1 + 4 + 2 = 9 per stage: bubble 1 - 18 / (2 × 14) = 10/28.
    job = plan_job([8, 4], [[[0], [1]]], ParallelLayout(pp=2, cp=2), PER_TOKEN)
    sim = simulate(ONE_TFLOPS, job, job.schedule.steps[0])
    assert sim["sim/step_s"] == pytest.approx(14.0)
    assert sim["sim/bubble_frac"] == pytest.approx(10 / 28)
    assert sim["sim/peak_tokens"] == 4  # 8 tokens over cp=2 GPUs


def test_sim_quadratic_cost_by_hand():
    # cost 3e12 × L² (a = 0): one rank, one micro-batch {2, 2}: 3e12 × (4 + 4) FLOPs, forward
    # 8 s on one GPU; step 3 × 8 = 24 s, no bubble with pp=1.
    job = plan_job([2, 2], [[[0, 1]]], ParallelLayout(), (0.0, 3e12))
    sim = simulate(ONE_TFLOPS, job, job.schedule.steps[0])
    assert sim["sim/step_s"] == pytest.approx(24.0)
    assert sim["sim/bubble_frac"] == pytest.approx(0.0)
    assert sim["sim/peak_tokens"] == 4
