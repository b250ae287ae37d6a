"""The wandb dashboard spec, built and checked offline: its panels plot keys the code logs, and
the wandb-workspaces Workspace built from it holds the same sections and panels."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from slime_hydra.dashboard import CAP, SWEPT, Line, Parallel, dashboard, main, workspace
from slime_hydra.log.summary import SUMMARY
from slime_hydra.planner import plan_rollout
from slime_hydra.schedule import ParallelLayout

PACKAGE = Path(__file__).resolve().parents[2] / "slime_hydra"


def lines(section: str) -> dict[str, tuple[str, ...]]:
    (found,) = [s for s in dashboard("p").sections if s.name == section]
    return {p.title: p.keys for p in found.panels if isinstance(p, Line)}


def test_sections_hold_the_panels_the_issue_asks_for() -> None:
    assert [s.name for s in dashboard("p").sections] == ["Schedule", "Training", "Sweeps"]
    schedule = set(lines("Schedule").values())
    assert schedule == {
        ("batch/num_microbatches", "batch/num_microbatches_lb"),
        ("batch/mb_tokens_max", "batch/mb_tokens_lb"),
        ("batch/token_imbalance", "batch/dp_token_imbalance"),
        ("batch/flops_imbalance", "batch/dp_flops_imbalance"),
        ("batch/cap_violations", "batch/empty_microbatches"),
    }
    assert set(lines("Training").values()) == {
        ("train/loss",),
        ("train/grad_norm",),
        ("perf/tokens_per_s",),
        ("sim/step_s", "perf/step_s"),
    }


def test_schedule_panels_plot_what_step_metrics_logs_and_the_cap_expression_is_the_cap() -> None:
    planned = plan_rollout([5, 3, 2, 2], ParallelLayout(dp=2), 8)
    metrics = planned.metrics[0]
    assert {k for keys in lines("Schedule").values() for k in keys} <= metrics.keys()
    # The cap panel's expression: mean micro-batch / utilization = (12 / 2) / (12 / 16) = 8.
    inputs = re.findall(r"\$\{([^}]+)\}", CAP)
    assert inputs == ["batch/mb_tokens_mean", "batch/cap_utilization"]
    assert metrics[inputs[0]] / metrics[inputs[1]] == pytest.approx(planned.schedule.cap)


def test_training_and_sweep_keys_are_ones_the_trainers_and_the_summary_log() -> None:
    logged = "".join(p.read_text() for p in (PACKAGE / "train").rglob("*.py"))
    keys = {k for keys in lines("Training").values() for k in keys}
    assert all(f'"{k}"' in logged for k in keys), sorted(k for k in keys if f'"{k}"' not in logged)
    (parallel,) = [p for s in dashboard("p").sections for p in s.panels if isinstance(p, Parallel)]
    summaries = {f"summary/{name}" for _, name, _ in SUMMARY}
    assert all(k in summaries or f'"{k}"' in logged for k in parallel.summary)


def test_the_parallel_coordinates_span_the_swept_keys() -> None:
    spec = dashboard("p", swept=("batching.max_tokens_per_gpu", "batching.balance"))
    (parallel,) = [p for s in spec.sections for p in s.panels if isinstance(p, Parallel)]
    assert parallel.config == ("batching.max_tokens_per_gpu", "batching.balance")


def test_the_workspace_is_built_offline_from_the_spec() -> None:
    spec = dashboard("proj", "team")
    built = workspace(spec)
    assert (built.entity, built.project, built.settings.x_axis) == ("team", "proj", "step")
    assert [s.name for s in built.sections] == ["Schedule", "Training", "Sweeps"]
    for section, ours in zip(built.sections, spec.sections, strict=True):
        assert len(section.panels) == len(ours.panels)
        for panel, mine in zip(section.panels, ours.panels, strict=True):
            assert panel.title == mine.title
            if isinstance(mine, Line):
                assert (list(panel.y), panel.x) == (list(mine.keys), "step")
                assert panel.groupby == ("Group" if mine.grouped else None)
    parallel = built.sections[2].panels[0]
    names = [c.metric.name for c in parallel.columns]
    assert names[: len(SWEPT)] == list(SWEPT)
    assert type(parallel.columns[0].metric).__name__ == "Config"
    assert built.sections[0].panels[1].custom_expressions == [CAP]


def test_the_command_writes_the_spec_offline_and_says_how_to_create_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ws.json"
    assert (
        main(["--project", "p", "--entity", "e", "--swept", "parallel.dp", "--out", str(out)]) == 0
    )
    doc = json.loads(out.read_text())
    assert doc == json.loads(json.dumps(dashboard("p", "e", ("parallel.dp",)).to_json()))
    assert [p["kind"] for p in doc["sections"][2]["panels"]] == ["parallel", "line", "line"]
    said = capsys.readouterr().out
    assert f"to {out}" in said
    assert "--project p --entity e --swept parallel.dp --online" in said


def test_online_needs_an_entity() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--project", "p", "--online"])
    assert exc.value.code == 2
