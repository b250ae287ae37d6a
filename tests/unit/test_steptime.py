"""schedule.steptime: the step cost model, the simulated step by hand (the textbook bubble,
p2p sends, the step's tail), the order a rank's micro-batches run in, batching.count=fastest,
and calibration files (calibration.py)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_hydra.calibration import calibration_json, load_step_cost
from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.balanced import BalancedPacker
from slime_hydra.partition.base import Work
from slime_hydra.schedule import DynamicBatching, ParallelLayout, violations
from slime_hydra.schedule.steptime import (
    StepCost,
    bin_seconds,
    pipeline_seconds,
    rank_orders,
    simulate_step,
    simulation_visits,
)
from tests.families import FAMILIES, lengths_of

PER_TOKEN = StepCost(token_s=1.0, square_s=0.0, microbatch_s=0.0)  # 1 s per token, fwd+bwd


def test_equal_microbatches_give_the_textbook_bubble():
    # pp=4, 8 micro-batches of 3 tokens: 3 s forward+backward each, per stage f = 0.25, b = 0.5.
    # 1F1B: (m + pp - 1)(f + b) = 11 × 0.75 = 8.25 s, idle (pp - 1) / (m + pp - 1) = 3/11.
    timing = simulate_step([[[3]] * 8], ParallelLayout(pp=4), PER_TOKEN)
    assert timing.step_s == pytest.approx(8.25)
    assert timing.bubble_frac == pytest.approx(3 / 11)


def test_a_micro_batch_costs_the_tokens_the_engine_packs():
    # 1 s a token, 1 ms a squared token, 0.5 s a sequence. Padded to 128 tokens (the iterator's
    # tp × 128): samples of 100 and 20 tokens run as 128, the 8 of padding one more sequence;
    # 128 tokens need none.
    cost = StepCost(1.0, 0.001, 0.0, sequence_s=0.5, pad_multiple=128)
    seconds = bin_seconds(np.array([0, 0, 1]), np.array([100, 20, 128]), 2, cost)
    assert seconds == pytest.approx(
        [128 + 0.001 * (100**2 + 20**2 + 8**2) + 1.5, 128 + 16.384 + 0.5]
    )
    # cp=2, pad to 4 a rank: 5 and 3 tokens round up to 8 and 4 (2·cp chunks), 6 a rank pads to
    # 8: one more sequence of 2 × 2 tokens.
    cost = StepCost(1.0, 0.001, 0.0, sequence_s=0.5, pad_multiple=4, cp=2)
    seconds = bin_seconds(np.array([0, 0]), np.array([5, 3]), 1, cost)
    assert seconds == pytest.approx([16 + 0.001 * (64 + 16 + 16) + 1.5])


def test_a_micro_batch_costs_more_per_token_the_larger_it_is():
    # 1 µs a token and 1 ns a squared micro-batch token: 1,000 tokens in one micro-batch
    # cost 1e-3 + 1e-3 s; in two of 500, 2 × (5e-4 + 2.5e-4) = 1.5e-3 s.
    cost = StepCost(1e-6, 0.0, 0.0, microbatch_square_s=1e-9)
    one = bin_seconds(np.array([0, 0]), np.array([400, 600]), 1, cost)
    two = bin_seconds(np.array([0, 1]), np.array([500, 500]), 2, cost)
    assert one.tolist() == pytest.approx([2e-3]) and two.sum() == pytest.approx(1.5e-3)


def test_p2p_sends_and_the_tail_by_hand():
    # pp=2, one micro-batch of 6 tokens: f = 1, b = 2 per stage. F0 [0, 1], sent 0.5, F1
    # [1.5, 2.5], B1 [2.5, 4.5], sent 0.5, B0 [5, 7]; then all-reduce 1 and optimizer 2: 10 s.
    cost = StepCost(1.0, 0.0, 0.0, p2p_s=0.5, allreduce_s=1.0, optimizer_s=2.0)
    timing = simulate_step([[[6]]], ParallelLayout(pp=2), cost)
    assert timing.step_s == pytest.approx(10.0)
    assert timing.tail_s == pytest.approx(3.0)


def test_each_packed_sequence_costs_sequence_s():
    # dp=2, no pipeline: rank 0 runs {2, 3} and {5} (10 tokens, 4 + 9 + 25 = 38 L², 3
    # sequences, 2 micro-batches): 10 × 1 + 38 × 0.1 + 3 × 0.5 + 2 × 0.25 = 15.8 s; rank 1,
    # {10}: 10 + 100 × 0.1 + 0.5 + 0.25 = 20.75 s, the step.
    cost = StepCost(1.0, 0.1, 0.25, sequence_s=0.5)
    timing = simulate_step([[[2, 3], [5]], [[10]]], ParallelLayout(dp=2), cost)
    assert timing.step_s == pytest.approx(10 + 10.0 + 0.5 + 0.25)
    assert timing.slowest_rank == 1
    one = simulate_step([[[2, 3], [5]]], ParallelLayout(), cost)
    assert one.step_s == pytest.approx(15.8)


def test_the_analytic_cost_is_the_flops_at_the_achieved_speed():
    # 6e12 FLOPs per token, 2e12 per L², at 1 TFLOP/s over tp=2 × cp=3 GPUs; 4 ms a batch.
    cost = StepCost.analytic((6e12, 2e12), 1.0, 4.0, ParallelLayout(tp=2, cp=3))
    timing = simulate_step([[[2, 3]]], ParallelLayout(tp=2, cp=3), cost)
    assert timing.step_s == pytest.approx((6 * 5 + 2 * 13) / 6 + 0.004)


def step_s(seconds: list[float] | np.ndarray, layout: ParallelLayout) -> float:
    """One rank's pipeline over micro-batches of these seconds, in order."""
    return float(pipeline_seconds(np.array([seconds], dtype=float), layout, PER_TOKEN)[0])


@pytest.mark.parametrize(("pp", "vpp", "k"), [(2, 1, 5), (4, 1, 6), (2, 2, 6)])
def test_one_long_microbatch_goes_where_enumeration_says(pp, vpp, k):
    layout = ParallelLayout(pp=pp, vpp=vpp)
    seconds = np.array([9.0] + [1.0] * (k - 1))
    best = min(step_s(list(p), layout) for p in set(itertools.permutations(seconds.tolist())))
    ours = step_s(seconds[rank_orders(seconds[None], layout, PER_TOKEN, Work(10**9))[0]], layout)
    assert ours == pytest.approx(best) and best < step_s(seconds, layout)


def test_small_at_both_ends_beats_long_first_on_a_pipeline():
    # The anchors' order (verl #2452): the two short micro-batches at the ends.
    layout = ParallelLayout(pp=4)
    seconds = np.array([8.0, 8.0, 8.0, 1.0, 1.0])
    order = rank_orders(seconds[None], layout, PER_TOKEN, Work(10**9))[0]
    assert step_s(seconds[order], layout) < step_s(seconds, layout)


def test_every_rank_gets_its_own_order():
    # Two ranks at once: the long micro-batch is first on one, last on the other; each rank's
    # order is the one it gets alone (an order taken from the wrong rank's row would differ).
    layout = ParallelLayout(pp=2, vpp=2)
    seconds = np.array([[9.0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 9.0]])
    both = rank_orders(seconds, layout, PER_TOKEN, Work(10**9))
    for r in range(2):
        assert (
            both[r].tolist()
            == rank_orders(seconds[r : r + 1], layout, PER_TOKEN, Work(10**9))[0].tolist()
        )
        assert sorted(both[r].tolist()) == list(range(6))
    assert both[0].tolist() != both[1].tolist()


def test_fastest_takes_more_microbatches_where_the_pipeline_idles():
    # pp=4, 64 samples of 100 tokens under a cap of 1600: the fewest is 4 micro-batches of 16
    # (bubble 3/7); more, smaller ones shrink it while each costs only 1 ms more.
    layout = ParallelLayout(pp=4)
    cost = StepCost(token_s=1e-3, square_s=0.0, microbatch_s=1e-3)
    lengths = [100] * 64
    fewest = DynamicBatching(layout, 64, 1600).plan(lengths, list(range(64)))
    fast = DynamicBatching(layout, 64, 1600, count="fastest", step_cost=cost)
    schedule = fast.plan(lengths, list(range(64)))

    def step_s(s):
        return simulate_step(
            [[[lengths[i] for i in mb] for mb in r] for r in s.steps[0].ranks], layout, cost
        ).step_s

    assert fewest.steps[0].num_microbatches == 4
    assert schedule.steps[0].num_microbatches > 4
    assert step_s(schedule) < step_s(fewest)


def test_fastest_keeps_the_fewest_without_a_pipeline():
    # pp=1, one rank: every micro-batch more only adds its fixed cost.
    cost = StepCost(token_s=1e-3, square_s=0.0, microbatch_s=1e-3)
    lengths = [100] * 64
    fast = DynamicBatching(ParallelLayout(), 64, 1600, count="fastest", step_cost=cost)
    assert fast.plan(lengths, list(range(64))).steps[0].num_microbatches == 4


@pytest.mark.parametrize(("margin", "fewest"), [(0.4, True), (0.1, False)])
def test_fastest_takes_more_only_beyond_its_margin(margin, fewest):
    # pp=2, 16 samples of 100 tokens under a cap of 800, 1 ms a token: the fewest is 2
    # micro-batches of 8, (2 + 1) × 0.4 = 1.2 s. Every stage does 0.8 s of work whatever the
    # count, so no plan is 40% faster (the fewest stays); 4 micro-batches of 4 take
    # (4 + 1) × 0.2 = 1.0 s, 17% faster, so a 10% margin takes more.
    layout = ParallelLayout(pp=2)
    cost = StepCost(token_s=1e-3, square_s=0.0, microbatch_s=0.0)
    lengths = [100] * 16
    fast = DynamicBatching(
        layout, 16, 800, count="fastest", count_margin=margin, step_cost=cost
    ).plan(lengths, list(range(16)))
    ranks = [[[lengths[i] for i in mb] for mb in r] for r in fast.steps[0].ranks]
    seconds = simulate_step(ranks, layout, cost).step_s
    if fewest:
        assert fast.steps[0].num_microbatches == 2 and seconds == pytest.approx(1.2)
    else:
        assert fast.steps[0].num_microbatches > 2 and seconds <= 0.9 * 1.2


@pytest.mark.parametrize("margin", [-0.01, 1.0])
def test_the_count_margin_is_a_share_below_one(margin):
    cost = StepCost(token_s=1e-3, square_s=0.0, microbatch_s=0.0)
    with pytest.raises(SlimeHydraError, match=rf"batching\.count_margin={margin} must lie"):
        DynamicBatching(
            ParallelLayout(), 8, 100, count="fastest", count_margin=margin, step_cost=cost
        )


def test_fastest_tries_only_what_its_budget_pays_for():
    # The pp=4 case above: with no budget `fastest` neither packs another count nor orders
    # the micro-batches, so it plans what `min` plans; the default budget finds more.
    layout = ParallelLayout(pp=4)
    cost = StepCost(token_s=1e-3, square_s=0.0, microbatch_s=1e-3)
    lengths = [100] * 64
    none = BalancedPacker(budget=0, budget_per_sample=0)
    fewest = DynamicBatching(layout, 64, 1600, partitioner=none).plan(lengths, list(range(64)))
    broke = DynamicBatching(layout, 64, 1600, partitioner=none, count="fastest", step_cost=cost)
    planned = broke.plan(lengths, list(range(64))).steps[0]
    assert (planned.samples, planned.samples_per_mb) == (
        fewest.steps[0].samples,
        fewest.steps[0].samples_per_mb,
    )
    fast = DynamicBatching(layout, 64, 1600, count="fastest", step_cost=cost)
    assert fast.plan(lengths, list(range(64))).steps[0].num_microbatches > 4


def test_the_orders_tried_are_those_the_work_pays_for():
    # pp=2, one rank of 5 micro-batches, the long one first. The four orders simulate 13 s
    # (planned), 11.33 (ascending), 11.67 (descending), 11.5 (small at both ends): with the
    # work of those 4 simulations ascending wins; with none the plan's order stays.
    layout = ParallelLayout(pp=2)
    seconds = np.array([[9.0, 1, 1, 1, 3]])
    four = simulation_visits(layout, 5, 4)
    assert rank_orders(seconds, layout, PER_TOKEN, Work(0)).tolist() == [[0, 1, 2, 3, 4]]
    work = Work(four)
    assert rank_orders(seconds, layout, PER_TOKEN, work).tolist() == [[1, 2, 3, 4, 0]]
    assert work.spent == four
    # [9, 1, 1, 1, 1]: all four orders take 11 s; the long one second, 10.67 s, is the best
    # enumeration finds, and the k moves that reach it cost k simulations more.
    seconds = np.array([[9.0, 1, 1, 1, 1]])
    paid = Work(four + simulation_visits(layout, 5, 5))
    order = rank_orders(seconds, layout, PER_TOKEN, paid)[0]
    assert step_s(seconds[0][order], layout) == pytest.approx(32 / 3)


def test_fastest_needs_a_cost_model():
    with pytest.raises(SlimeHydraError, match=r"batching\.count=min"):
        DynamicBatching(ParallelLayout(), 8, 100, count="fastest")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(set(FAMILIES) - {"oversize"})),
    st.integers(0, 2**32 - 1),
    st.sampled_from([(1, 1, 1), (2, 2, 1), (2, 4, 1), (1, 2, 2), (3, 1, 1)]),
    st.sampled_from([0, 20_000, 100_000]),
)
def test_fastest_never_simulates_slower_than_the_fewest(family, seed, shape, budget):
    dp, pp, vpp = shape
    rng = np.random.default_rng(seed)
    layout = ParallelLayout(dp=dp, pp=pp, vpp=vpp)
    n = int(rng.integers(16, 200)) * dp * layout.microbatch_alignment
    lengths = lengths_of(family, rng, n, 4096).tolist()
    cost = StepCost(1e-4, 1e-9, float(rng.choice([0.0, 1e-3, 0.05])), p2p_s=1e-3)
    groups = list(range(n))
    packer = BalancedPacker(budget=budget)
    try:
        fewest = DynamicBatching(layout, n, 4096, partitioner=packer).plan(lengths, groups)
    except SlimeHydraError:
        return  # no plan exists for this draw (e.g. n samples over cap/2 on too few ranks)
    fast = DynamicBatching(layout, n, 4096, partitioner=packer, count="fastest", step_cost=cost)
    schedule = fast.plan(lengths, groups)
    assert violations(schedule, layout, groups, False) == []
    assert schedule.steps[0].num_microbatches >= fewest.steps[0].num_microbatches

    def step_s(s):
        ranks = [[[lengths[i] for i in mb] for mb in r] for r in s.steps[0].ranks]
        return simulate_step(ranks, layout, cost).step_s

    assert step_s(schedule) <= step_s(fewest) * (1 + 1e-9)


def _write(tmp_path, layout, model="toy", **terms):
    cost = StepCost(**{"token_s": 1e-6, "square_s": 1e-12, "microbatch_s": 1e-3, **terms})
    path = tmp_path / "cost.json"
    path.write_text(calibration_json(cost, {}, model, "cpu", layout, []))
    return path


def test_a_calibration_file_loads_for_its_model_and_layout(tmp_path):
    path = _write(tmp_path, ParallelLayout(dp=2, pp=2), p2p_s=2e-4)
    cost = load_step_cost(path, "toy", ParallelLayout(dp=4, pp=2))  # dp may differ
    assert (cost.token_s, cost.p2p_s, cost.source) == (1e-6, 2e-4, str(path))


@pytest.mark.parametrize(
    ("model", "layout"), [("other", ParallelLayout(pp=2)), ("toy", ParallelLayout(tp=2))]
)
def test_a_calibration_for_another_model_or_layout_is_refused(tmp_path, model, layout):
    path = _write(tmp_path, ParallelLayout(pp=2))
    with pytest.raises(SlimeHydraError, match="calibrate this one"):
        load_step_cost(path, model, layout)


@pytest.mark.parametrize(
    "terms",
    [
        {"token_s": 1e-6, "square_s": 0.0},  # no microbatch_s
        {"token_s": 1e-6, "square_s": 0.0, "microbatch_s": 0.0, "launch_s": 1.0},
        {"token_s": -1.0, "square_s": 0.0, "microbatch_s": 0.0},
        {"token_s": "fast", "square_s": 0.0, "microbatch_s": 0.0},
    ],
)
def test_bad_terms_are_refused_with_the_fix(tmp_path, terms):
    path = tmp_path / "cost.json"
    layout = {"dp": 1, "tp": 1, "pp": 1, "vpp": 1, "cp": 1}
    path.write_text(json.dumps({"format": 1, "model": "toy", "layout": layout, "terms": terms}))
    with pytest.raises(SlimeHydraError, match="calibrate"):
        load_step_cost(path, "toy", ParallelLayout())
