"""calibration.py's fit and grid, and the calibrate command's pure parts: synthetic timings made
by the simulator from known terms come back as those terms, with standard errors that cover
them; the grid separates the terms; the timed steps and their order."""

from __future__ import annotations

import numpy as np
import pytest

from slime_hydra.calibrate import calibrate, grid_job, grid_order, timed_samples
from slime_hydra.calibration import (
    calibration_grid,
    calibration_json,
    fit_step_cost,
    load_step_cost,
    sample_ranks,
)
from slime_hydra.errors import SlimeHydraError
from slime_hydra.schedule import ParallelLayout, violations
from slime_hydra.schedule.steptime import StepCost, simulate_step

DP2 = ParallelLayout(dp=2)
PP2_VPP2 = ParallelLayout(pp=2, vpp=2, microbatch_group_size_per_vp_stage=2)
TRUE = StepCost(
    2e-5,
    3e-9,
    4e-3,
    sequence_s=5e-4,
    microbatch_square_s=2e-9,
    p2p_s=1e-3,
    allreduce_s=0.01,
    optimizer_s=0.02,
)
START = StepCost(1e-6, 1e-10, 1e-4)  # far from TRUE, as the analytic model is on CPU
PIPELINE = ("token_s", "square_s", "microbatch_s", "sequence_s", "microbatch_square_s")


def exchanges(layout: ParallelLayout, cost: StepCost, noise: float = 0.0, seed: int = 0) -> list:
    """Eight timed rounds of p2p exchanges under `cost` (none without a pipeline)."""
    rng = np.random.default_rng(seed + 1000)
    return [cost.p2p_s * (1 + noise * rng.standard_normal()) for _ in range(8 * (layout.pp > 1))]


def synthetic(layout: ParallelLayout, cost: StepCost, noise: float, seed: int = 0) -> list[dict]:
    """The grid timed by the simulator under `cost`, pipeline seconds with relative noise."""
    rng = np.random.default_rng(seed)
    pipe = StepCost(
        cost.token_s,
        cost.square_s,
        cost.microbatch_s,
        sequence_s=cost.sequence_s,
        microbatch_square_s=cost.microbatch_square_s,
        p2p_s=cost.p2p_s,
    )
    samples = []
    for count, mb in calibration_grid(layout, 2048):
        sample = {"num_microbatches": count, "microbatch": mb}
        seconds = simulate_step(sample_ranks(sample, layout.dp), layout, pipe).step_s
        samples.append(
            {
                **sample,
                "pipeline_s": seconds * (1 + noise * rng.standard_normal()),
                "allreduce_s": cost.allreduce_s * (1 + noise * rng.standard_normal()),
                "optimizer_s": cost.optimizer_s * (1 + noise * rng.standard_normal()),
            }
        )
    return samples


@pytest.mark.parametrize("layout", [DP2, PP2_VPP2], ids=["dp2", "pp2_vpp2"])
def test_exact_timings_give_back_the_terms(layout: ParallelLayout) -> None:
    true = TRUE if layout.pp > 1 else StepCost(**{**TRUE.__dict__, "p2p_s": 0.0})
    samples = synthetic(layout, true, noise=0.0)
    cost, stderr = fit_step_cost(samples, layout, START, "f.json", exchanges(layout, true))
    terms = (*PIPELINE, "p2p_s") if layout.pp > 1 else PIPELINE
    for name in (*terms, "allreduce_s", "optimizer_s"):
        assert getattr(cost, name) == pytest.approx(getattr(true, name), rel=1e-6), name
        assert stderr[name] < 1e-6 * getattr(true, name), name
    assert cost.source == "f.json"
    assert ("p2p_s" in stderr) == (layout.pp > 1)


@pytest.mark.parametrize("seed", range(4))
def test_standard_errors_cover_the_terms_under_noise(seed: int) -> None:
    samples = synthetic(PP2_VPP2, TRUE, noise=0.02, seed=seed)
    measured = exchanges(PP2_VPP2, TRUE, noise=0.02, seed=seed)
    cost, stderr = fit_step_cost(samples, PP2_VPP2, START, "f.json", measured)
    for name in (*PIPELINE, "p2p_s"):
        assert abs(getattr(cost, name) - getattr(TRUE, name)) < 4 * stderr[name], name
        assert stderr[name] < 0.5 * getattr(TRUE, name), name  # the grid tells them apart


def test_a_term_the_data_does_not_need_is_held_at_zero() -> None:
    # No L² cost at all: noise alone would give square_s either sign; it is never negative.
    true = StepCost(2e-5, 0.0, 4e-3)
    for seed in range(6):
        cost, _ = fit_step_cost(synthetic(DP2, true, noise=0.05, seed=seed), DP2, START, "f")
        assert cost.square_s >= 0
        assert cost.token_s == pytest.approx(true.token_s, rel=0.2)


def test_too_few_timed_steps_are_refused() -> None:
    samples = synthetic(PP2_VPP2, TRUE, noise=0.0)[:5]
    with pytest.raises(SlimeHydraError, match="more than 5 timed steps, got 5"):
        fit_step_cost(samples, PP2_VPP2, START, "f", exchanges(PP2_VPP2, TRUE))


def test_a_pipeline_takes_its_timed_exchanges() -> None:
    samples = synthetic(PP2_VPP2, TRUE, noise=0.0)
    with pytest.raises(SlimeHydraError, match="pp=2 takes at least 2 timed rounds"):
        fit_step_cost(samples, PP2_VPP2, START, "f")
    with pytest.raises(SlimeHydraError, match="pp=1 takes no timed rounds"):
        fit_step_cost(synthetic(DP2, TRUE, noise=0.0), DP2, START, "f", [1e-3, 1e-3])


def test_the_exchanges_on_the_critical_path_are_not_fitted_again() -> None:
    # p2p_s measured at twice the truth: the step's other terms absorb the difference (the
    # fit explains the same times), but p2p_s is the measured median, not refitted.
    measured = [2 * TRUE.p2p_s, 2 * TRUE.p2p_s, 2.2 * TRUE.p2p_s]
    samples = synthetic(PP2_VPP2, TRUE, noise=0.0)
    cost, stderr = fit_step_cost(samples, PP2_VPP2, START, "f", measured)
    assert cost.p2p_s == pytest.approx(2 * TRUE.p2p_s)
    assert stderr["p2p_s"] == pytest.approx(np.std(measured, ddof=1) / np.sqrt(3))
    assert cost.microbatch_s < TRUE.microbatch_s


def test_the_grid_separates_the_terms() -> None:
    grid = calibration_grid(PP2_VPP2, 2048)
    # Each size as one, four and sixteen sequences of the same total: ΣL alike, ΣL² not.
    totals = {sum(mb) for _, mb in grid}
    assert totals == {256, 512, 1024, 2048}
    for total in totals:
        squares = {sum(x * x for x in mb) for _, mb in grid if sum(mb) == total}
        assert len(squares) == 3
    # Counts are whole VPP groups (megatron's interleaved schedule needs them): 2, 4, 8.
    assert {count for count, _ in grid} == {2, 4, 8}
    assert {count for count, _ in calibration_grid(DP2, 2048)} == {1, 2, 4}
    with pytest.raises(SlimeHydraError, match="--max-tokens=200 is below"):
        calibration_grid(DP2, 200)


def test_the_grid_reaches_down_to_the_smallest_micro_batches_asked() -> None:
    # --min-tokens 256 under a cap of 16,384: every halving from the cap down to 256 (fixed
    # micro_batch_size=1 of short answers packs ~256 tokens, 1/64 of the cap).
    grid = calibration_grid(DP2, 16384, None, None, 256)
    assert {sum(mb) for _, mb in grid} == {256, 512, 1024, 2048, 4096, 8192, 16384}
    assert min(min(mb) for _, mb in grid) == 16  # 256 as sixteen sequences
    with pytest.raises(SlimeHydraError, match="--min-tokens=8"):
        calibration_grid(DP2, 16384, None, None, 8)
    with pytest.raises(SlimeHydraError, match="--min-tokens=4096"):
        calibration_grid(DP2, 2048, None, None, 4096)


def test_the_grid_reaches_the_cap_in_sequences_the_model_can_run() -> None:
    # Up to 16,384 tokens a micro-batch on a model of 4,096 positions: the "one sequence"
    # entries become as many of 4,096 as the total needs, and where that equals the four-way
    # split the entry is timed once.
    grid = calibration_grid(DP2, 16384, None, 4096)
    assert max(max(mb) for _, mb in grid) == 4096
    by_total: dict[int, set[tuple[int, ...]]] = {}
    for _, mb in grid:
        by_total.setdefault(sum(mb), set()).add(tuple(mb))
    assert by_total[16384] == {(4096,) * 4, (1024,) * 16}
    assert by_total[8192] == {(4096,) * 2, (2048,) * 4, (512,) * 16}
    assert by_total[2048] == {(2048,), (512,) * 4, (128,) * 16}
    assert len(grid) == len({(c, tuple(mb)) for c, mb in grid}) == 11 * 3


def test_the_grid_reaches_the_counts_the_runs_take() -> None:
    # Whole VPP groups of 2, doubling up to --max-microbatches (a count between two is not
    # timed): the per-micro-batch cost is measured where the runs are, not extrapolated.
    assert {count for count, _ in calibration_grid(PP2_VPP2, 2048, 16)} == {2, 4, 8, 16}
    assert {count for count, _ in calibration_grid(PP2_VPP2, 2048, 12)} == {2, 4, 8}
    assert {count for count, _ in calibration_grid(DP2, 2048, 32)} == {1, 2, 4, 8, 16, 32}
    with pytest.raises(SlimeHydraError, match=r"--max-microbatches=3: .* \(2 micro-batches each\)"):
        calibration_grid(PP2_VPP2, 2048, 3)


def test_steps_run_once_as_warm_up_then_in_alternating_passes() -> None:
    assert grid_order(3, 3) == [0, 1, 2, 0, 1, 2, 2, 1, 0, 0, 1, 2]
    grid = [(1, [256]), (2, [64] * 4)]
    order = grid_order(2, 2)
    # [step_s, schedule_s, grad_reduce_s]; the warm-up's (the first two) are left out.
    timings = [[9.0, 9.0, 0.0], [9.0, 9.0, 0.0], [1.0, 0.7, 0.1], [2.0, 1.5, 0.2]]
    timings += [[2.2, 1.7, 0.2], [1.2, 0.9, 0.1]]
    first, second = timed_samples(grid, order, timings)
    assert first["pipeline_s"] == pytest.approx(0.7)  # median of 0.6 and 0.8
    assert first["pipeline_spread_s"] == pytest.approx([0.6, 0.8])
    assert first["optimizer_s"] == pytest.approx(0.3)
    assert second["step_s"] == pytest.approx(2.1)
    assert second["repeats"] == 2


def test_the_written_file_loads_as_the_fitted_cost(tmp_path) -> None:
    samples = synthetic(PP2_VPP2, TRUE, noise=0.0)
    measured = exchanges(PP2_VPP2, TRUE)
    cost, stderr = fit_step_cost(samples, PP2_VPP2, START, "f", measured)
    path = tmp_path / "cal.json"
    path.write_text(calibration_json(cost, stderr, "tiny", "cpu", PP2_VPP2, samples, measured))
    loaded = load_step_cost(path, "tiny", PP2_VPP2)
    names = (*PIPELINE, "p2p_s", "allreduce_s", "optimizer_s")
    assert [getattr(loaded, k) for k in names] == [getattr(cost, k) for k in names]


def test_the_grid_job_gives_every_rank_the_grid_and_each_sample_once(compose_cfg, tmp_path):
    cfg = compose_cfg("parallel.dp=2", "logger=jsonl")
    grid = calibration_grid(DP2, 256)
    order = grid_order(len(grid), 2)
    job = grid_job(cfg, tmp_path, grid, order)
    lengths = job.schedule.lengths
    assert len(job.schedule.steps) == len(order)
    for step, entry in zip(job.schedule.steps, order, strict=True):
        count, mb = grid[entry]
        assert [[[lengths[i] for i in m] for m in rank] for rank in step.ranks] == [
            [mb] * count
        ] * 2
    assert sorted(i for s in job.schedule.steps for i in s.samples) == list(range(len(lengths)))
    assert list(job.rollout.total_lengths) == list(lengths)
    assert not violations(job.schedule, job.layout, job.rollout.group_ids)


def test_calibrate_refuses_plan_mode_and_a_single_pass(compose_cfg, tmp_path) -> None:
    with pytest.raises(SlimeHydraError, match="pass trainer=cpu or trainer=gpu"):
        calibrate(compose_cfg("trainer=plan"), tmp_path / "c.json", 3, 256)
    with pytest.raises(SlimeHydraError, match=r"--repeats=1: .* pass --repeats 3"):
        calibrate(compose_cfg(), tmp_path / "c.json", 1, 256)
