"""train.run.drift: the calibration's drift, judged by hand-computed medians."""

from __future__ import annotations

import math

from slime_hydra.train.run.drift import DriftCheck


def observe_all(check: DriftCheck, ratios: list[float]) -> list[str | None]:
    return [check.observe(step, r) for step, r in enumerate(ratios, 1)]


def test_five_steps_whose_median_is_off_by_more_than_15_percent_warn_once():
    check = DriftCheck("cpu-dp2.json")
    # Step 1 (warm-up) is not judged; steps 2-6 have median 1.2 (of 1.0, 1.2, 1.3, 1.2, 1.25).
    said = observe_all(check, [9.0, 1.0, 1.2, 1.3, 1.2, 1.25, 2.0, 2.0])
    assert said[:5] == [None] * 5
    assert said[5] is not None and said[6:] == [None, None]
    assert said[5].startswith("steps 2-6 took 1.20x the step time that trainer.cost=cpu-dp2.json")
    assert "python -m slime_hydra.calibrate --out FILE" in said[5]


def test_a_median_within_15_percent_either_way_or_one_outlier_says_nothing():
    within = [1.0, 1.15, 1.15, 1.15, 0.87, 0.87]  # medians 1.15, then 1.15
    assert observe_all(DriftCheck("f.json"), within) == [None] * 6
    outlier = [1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 0.1]  # one slow and one fast step among five
    assert observe_all(DriftCheck("f.json"), outlier) == [None] * 7


def test_faster_than_predicted_warns_too_and_a_nan_step_is_not_counted():
    check = DriftCheck("f.json")
    said = observe_all(check, [1.0, 0.8, math.nan, 0.8, 0.8, 0.8, 0.8])
    # 1/1.15 = 0.8696 > 0.8; the NaN step 3 does not fill the window, step 7 completes it.
    assert said[:6] == [None] * 6
    assert said[6] is not None and said[6].startswith("steps 2-7 took 0.80x")
