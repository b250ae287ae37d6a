"""python -m slime_hydra.calibrate end to end on the tiny model (2 gloo ranks, dp=2): the file
it writes loads for trainer=plan and trainer=cpu (trainer.cost=FILE), and each trainer=cpu step
logs the calibrated prediction sim/step_s beside the measured perf/step_s."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from slime_hydra.calibration import PIPELINE_TERMS, load_step_cost
from slime_hydra.schedule import ParallelLayout, Schedule
from slime_hydra.schedule.steptime import simulate_step
from tests.integration.test_train_cpu import SMALL, metrics, ok, run_cli

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration
DP2 = ParallelLayout(dp=2)


@pytest.fixture(scope="module")
def calibration(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A calibration of the tiny model on dp=2 (small grid, two passes)."""
    out = tmp_path_factory.mktemp("calibration") / "tiny-dp2.json"
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra.calibrate", "--out", str(out)]
    args = ["--repeats", "2", "--max-tokens", "256", "logger=jsonl", "parallel.dp=2"]
    proc = subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert f"wrote {out}" in proc.stderr
    return out


def test_the_file_holds_fitted_terms_and_what_was_timed(calibration: Path) -> None:
    data = json.loads(calibration.read_text())
    assert data["model"] == "tiny" and data["layout"]["dp"] == 2
    assert data["device"].startswith("cpu (gloo)")
    # Which pipeline term the timings load depends on the machine's load (on a busy machine a
    # grid of 32-256 token micro-batches fitted token_s at 0 and gave the time to the others);
    # that the fit puts them somewhere, and measures the all-reduce, does not.
    terms = data["terms"]
    assert all(terms[t] >= 0 for t in PIPELINE_TERMS) and sum(terms[t] for t in PIPELINE_TERMS) > 0
    assert terms["allreduce_s"] > 0
    assert data["terms"]["p2p_s"] == 0.0 and "p2p_s" not in data["stderr"]  # pp=1
    assert set(data["stderr"]) == {
        "token_s",
        "square_s",
        "microbatch_s",
        "sequence_s",
        "microbatch_square_s",
        "allreduce_s",
        "optimizer_s",
    }
    assert len(data["samples"]) == 36
    assert all(s["repeats"] == 2 and s["predicted_step_s"] > 0 for s in data["samples"])


def simulated(run_dir: Path, calibration: Path) -> list[float]:
    """simulate_step of each step of the run's schedule.json under the calibration."""
    schedule = Schedule.from_json(json.loads((run_dir / "schedule.json").read_text()))
    # Packed as the iterator packs: to its default multiple of tp × 128 tokens.
    cost = replace(load_step_cost(calibration, "tiny", DP2), pad_multiple=128)
    lengths = schedule.lengths
    return [
        simulate_step([[[lengths[i] for i in mb] for mb in r] for r in s.ranks], DP2, cost).step_s
        for s in schedule.steps
    ]


def test_plan_mode_simulates_with_the_calibration(tmp_path: Path, calibration: Path) -> None:
    ok(run_cli(tmp_path, *SMALL, "trainer=plan", f"trainer.cost={calibration}"))
    rows = metrics(tmp_path)
    assert [r["sim/step_s"] for r in rows] == pytest.approx(simulated(tmp_path, calibration))


def test_training_logs_prediction_beside_measurement(tmp_path: Path, calibration: Path) -> None:
    ok(run_cli(tmp_path, *SMALL, f"trainer.cost={calibration}"))
    rows = metrics(tmp_path)
    assert [r["sim/step_s"] for r in rows] == pytest.approx(simulated(tmp_path, calibration))
    for row in rows:
        assert row["perf/sim_ratio"] == pytest.approx(row["perf/step_s"] / row["sim/step_s"])
        assert 0 <= row["sim/bubble_frac"] < 1


def test_a_calibration_that_no_longer_holds_is_said_once(tmp_path: Path, calibration: Path) -> None:
    # The file's terms 30x: a calibration from a slower machine, or from before a change. Six
    # steps: the first is warm-up, the next five have a median ratio near 1/30.
    stale = json.loads(calibration.read_text())
    stale["terms"] = {term: value * 30 for term, value in stale["terms"].items()}
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(stale))
    run_dir = tmp_path / "run"
    overrides = [o for o in SMALL if not o.startswith("data.num_prompts=")]
    out = ok(run_cli(run_dir, *overrides, "data.num_prompts=12", f"trainer.cost={path}"))
    assert len(metrics(run_dir)) == 6
    assert out.count(f"the step time that trainer.cost={path} predicts") == 1, out[-6000:]
    assert "steps 2-6 took 0.0" in out


def test_a_pipeline_calibration_times_its_exchanges(tmp_path: Path) -> None:
    # pp=2 vpp=2: p2p_s is measured on its own (8 timed rounds of exchanges through megatron's
    # P2PCommunicator), not fitted: it is their median, with the mean's standard error.
    out = tmp_path / "tiny-pp2.json"
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra.calibrate", "--out", str(out)]
    args = ["--repeats", "2", "--max-tokens", "256", "logger=jsonl", "model.num_layers=4"]
    args += ["parallel.dp=1", "parallel.pp=2", "parallel.vpp=2"]
    args += ["parallel.microbatch_group_size_per_vp_stage=2"]
    proc = subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    data = json.loads(out.read_text())
    exchanges = data["exchange_s"]
    assert len(exchanges) == 8 and all(0 < s < 1 for s in exchanges)
    assert data["terms"]["p2p_s"] == pytest.approx(statistics.median(exchanges))
    assert data["stderr"]["p2p_s"] > 0
