"""Report helpers on hand-made run dirs: summaries, token counts, labels, figures written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime_hydra.report.__main__ import report
from slime_hydra.report.plots import job_labels, shared_overrides
from slime_hydra.report.rundir import RunDir, run_summary, sweep_jobs
from slime_hydra.schedule import Schedule

LENGTHS = [5, 3, 4, 6, 2, 8]
SCHEDULE = {
    "lengths": LENGTHS,
    "cap": 10,
    "steps": [
        {"step": 0, "num_microbatches": 2, "ranks": [[[0, 1], [2]], [[3], [4]]]},
        {"step": 1, "num_microbatches": 2, "ranks": [[[5, 0]], []]},
    ],
}


def make_run(path: Path, violations: tuple[int, int] = (0, 1)) -> Path:
    """A run dir with schedule.json above and two metrics rows."""
    path.mkdir(parents=True)
    (path / "schedule.json").write_text(json.dumps(SCHEDULE))
    rows = [
        {
            "step": step,
            "batch/num_microbatches": 2,
            "batch/num_microbatches_lb": 1,
            "batch/mb_tokens_max": 13 if step else 8,
            "batch/token_imbalance": 1.0 + step,
            "batch/dp_token_imbalance": 1.1,
            "batch/flops_imbalance": 1.2,
            "batch/cap_violations": violations[step],
            "batch/empty_microbatches": step,
        }
        for step in (0, 1)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_microbatch_tokens_per_rank() -> None:
    schedule = Schedule.from_json(SCHEDULE)
    assert schedule.microbatch_tokens(0) == [[8, 4], [6, 2]]
    assert schedule.microbatch_tokens(1) == [[13], []]


def test_run_summary_takes_worst_totals_and_means() -> None:
    rows = [
        {"step": 0, "batch/cap_violations": 2, "batch/token_imbalance": 1.0},
        {"step": 1, "batch/cap_violations": 3, "batch/token_imbalance": 1.5},
        {"step": 2, "batch/cap_violations": 0, "batch/token_imbalance": None},
    ]
    summary = run_summary(rows)
    assert summary["steps"] == 3
    assert summary["cap_violations_max"] == 3
    assert summary["cap_violations_total"] == 5
    assert summary["token_imbalance_mean"] == pytest.approx(1.25)
    assert "empty_microbatches_total" not in summary


def test_job_labels_drop_the_shared_overrides() -> None:
    names = ["0_batching=dynamic,parallel.dp=4", "1_batching=slime_1823,parallel.dp=4"]
    assert shared_overrides(names) == ["parallel.dp=4"]
    assert job_labels(names) == ["batching=dynamic", "batching=slime_1823"]
    assert job_labels(["0_seed=1"]) == ["seed=1"]


def test_sweep_jobs_in_job_number_order(tmp_path: Path) -> None:
    for name in ("10_seed=3", "2_seed=2", "0_seed=1"):
        make_run(tmp_path / name)
    (tmp_path / "report").mkdir()
    assert [p.name for p in sweep_jobs(tmp_path)] == ["0_seed=1", "2_seed=2", "10_seed=3"]


def test_report_of_a_run_and_of_a_sweep(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    assert [r["step"] for r in RunDir.read(run).metrics] == [0, 1]
    [png] = report(run)
    assert png == run / "report" / "run.png" and png.stat().st_size > 10_000
    sweep = tmp_path / "sweep"
    make_run(sweep / "0_seed=1")
    make_run(sweep / "1_seed=2")
    written = report(sweep, tmp_path / "out")
    assert [p.name for p in written] == ["sweep.png", "0_seed=1.png", "1_seed=2.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)


def test_report_refuses_a_dir_without_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="neither a run dir"):
        report(tmp_path)
