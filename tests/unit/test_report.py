"""Report helpers on hand-made run and sweep dirs: summaries, token counts, labels, which panels
a run's metrics get, the rank summary beyond a few DP ranks, failed jobs, the sweep's count."""

from __future__ import annotations

import json
import warnings
from itertools import combinations
from pathlib import Path

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.text import Text
from omegaconf import OmegaConf

from slime_hydra.report.__main__ import FAILED_FILE, main, report
from slime_hydra.report.panels import step_panels, sweep_value
from slime_hydra.report.plots import (
    job_labels,
    run_figure,
    shared_overrides,
    sweep_figure,
    sweep_panels,
    wrap_overrides,
)
from slime_hydra.report.rundir import RunDir, failed_jobs, run_summary, sweep_jobs
from slime_hydra.rundir import SWEEP_JOBS, note_sweep_job
from slime_hydra.schedule import Schedule
from slime_hydra.sweep import SweepSummary, sweep_line

LENGTHS = [5, 3, 4, 6, 2, 8]
SCHEDULE = {
    "lengths": LENGTHS,
    "cap": 10,
    "steps": [
        {"step": 1, "num_microbatches": 2, "ranks": [[[0, 1], [2]], [[3], [4]]]},
        {"step": 2, "num_microbatches": 2, "ranks": [[[5, 0]], []]},
    ],
}
BATCH = {
    "batch/num_microbatches": 2,
    "batch/num_microbatches_lb": 1,
    "batch/token_imbalance": 1.0,
    "batch/dp_token_imbalance": 1.1,
    "batch/flops_imbalance": 1.2,
    "batch/cap_violations": 0,
    "batch/empty_microbatches": 0,
}
PLAN = {"sim/step_s": 0.5, "sim/bubble_frac": 0.25, "sim/peak_tokens": 13}
TRAIN = {"train/loss": 0.5, "train/grad_norm": 1.0, "perf/step_s": 2.0, "perf/tokens_per_s": 9.0}
PLAN_TITLES = ["Simulated step time", "Simulated pipeline bubble"]
TRAIN_TITLES = ["Training loss", "Throughput"]
BASE_TITLES = ["Micro-batches per step", "Imbalance over steps"]


def write_run(path: Path, rows: list[dict], schedule: dict | None = SCHEDULE) -> Path:
    """A run dir holding `rows` as metrics.jsonl and `schedule` as schedule.json."""
    path.mkdir(parents=True)
    if schedule is not None:
        (path / "schedule.json").write_text(json.dumps(schedule))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def make_run(path: Path, violations: tuple[int, int] = (0, 1), first_step: int = 0) -> Path:
    """A run dir with schedule.json above and two metrics rows, numbered from `first_step`."""
    rows = [
        {
            **BATCH,
            "step": first_step + i,
            "batch/mb_tokens_max": 13 if i else 8,
            "batch/token_imbalance": 1.0 + i,
            "batch/cap_violations": violations[i],
            "batch/empty_microbatches": i,
        }
        for i in (0, 1)
    ]
    return write_run(path, rows)


def write_failed(path: Path, error: str | None) -> Path:
    """A sweep job dir as the app leaves a refused job: its lock, and error.txt if given."""
    path.mkdir(parents=True)
    (path / ".lock").write_text("")
    if error is not None:
        (path / "error.txt").write_text(error)
    return path


def dotted(ax) -> list:
    """The panel's lines drawn with dot markers (not the cap or reference lines)."""
    return [line for line in ax.lines if line.get_marker() == "o"]


def titles(fig: Figure) -> list[str]:
    """The titles of the figure's visible axes, in order."""
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def shown_ticks(labels: list[Text], bounds: list[float], axis: int) -> list[Text]:
    """The tick labels inside the axis's view (matplotlib keeps some beyond it, undrawn)."""
    return [t for t in labels if bounds[0] <= t.get_position()[axis] <= bounds[1]]


def texts(fig: Figure) -> list[Text]:
    """Every text a reader sees: titles, axis and tick labels, legends, notes."""
    fig.canvas.draw()
    found: list[Text] = [fig._suptitle] if fig._suptitle is not None else []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        found += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        found += shown_ticks(ax.get_xticklabels(), sorted(ax.get_xlim()), 0)
        found += shown_ticks(ax.get_yticklabels(), sorted(ax.get_ylim()), 1)
        if ax.get_legend() is not None:
            found += ax.get_legend().get_texts()
    return [t for t in found if t.get_visible() and t.get_text()]


def assert_readable(fig: Figure) -> None:
    """No text outside the figure (clipped), no title on another title or on another panel,
    no legend on another panel, and no constrained-layout collapse."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    for text in texts(fig):
        box = text.get_window_extent(renderer)
        inside = page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1
        assert inside and page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, text.get_text()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    heads = [ax.title.get_window_extent(renderer) for ax in axes]
    if fig._suptitle is not None:
        heads.append(fig._suptitle.get_window_extent(renderer))
    for a, b in combinations(heads, 2):
        assert not a.overlaps(b)
    for ax in axes:
        others = [o.get_window_extent(renderer) for o in axes if o is not ax]
        title = ax.title.get_window_extent(renderer)
        assert not any(title.overlaps(o) for o in others), ax.get_title()
        if ax.get_legend() is not None:
            legend = ax.get_legend().get_window_extent(renderer)
            assert not any(legend.overlaps(o) for o in others), ax.get_title()


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


def test_long_override_lists_wrap_at_commas() -> None:
    assert wrap_overrides("aaaa,bb,cccccc,d", 7) == "aaaa,bb,\ncccccc,\nd"
    assert wrap_overrides("a=1,b=2", 100) == "a=1,b=2"
    assert wrap_overrides("a_very_long_override=1", 5) == "a_very_long_override=1"


def test_panels_follow_the_metrics_a_run_logged() -> None:
    def keys(rows: list[dict]) -> list[str]:
        return [p.key for p in step_panels(rows)]

    assert keys([{"step": 1, **BATCH}]) == []
    assert keys([{"step": 1, **BATCH, **PLAN}]) == ["sim/step_s", "sim/bubble_frac"]
    assert keys([{"step": 1, **BATCH, **TRAIN}]) == ["train/loss", "perf/tokens_per_s"]
    # A metric logged as null (or on no step) gets no panel; one step with a value is enough.
    rows = [{"step": 1, "train/loss": None}, {"step": 2, "perf/tokens_per_s": 3.0}]
    assert keys(rows) == ["perf/tokens_per_s"]


def test_sweep_values_are_the_last_loss_and_mean_times() -> None:
    rows = [
        {"step": 1, "train/loss": 0.9, "perf/tokens_per_s": 100.0, "sim/step_s": None},
        {"step": 2, "train/loss": 0.3, "perf/tokens_per_s": 300.0},
    ]
    panels = {p.key: p for p in step_panels([{**PLAN, **TRAIN, "step": 1}])}
    assert sweep_value(rows, panels["train/loss"]) == 0.3
    assert sweep_value(rows, panels["perf/tokens_per_s"]) == 200.0
    assert sweep_value(rows, panels["sim/step_s"]) is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [({}, []), (PLAN, PLAN_TITLES), (TRAIN, TRAIN_TITLES), ({**PLAN, **TRAIN}, None)],
)
def test_run_figure_has_a_panel_per_logged_metric(tmp_path: Path, extra, expected) -> None:
    rows = [{"step": s, **BATCH, "batch/mb_tokens_max": 13, **extra} for s in (1, 2)]
    fig = run_figure(RunDir.read(write_run(tmp_path / "run", rows)))
    expected = TRAIN_TITLES + PLAN_TITLES if expected is None else expected
    found = [t.split(" (")[0] for t in titles(fig)]
    assert found == ["Micro-batch tokens per DP rank against the cap", *BASE_TITLES, *expected]


def test_metric_panels_plot_the_logged_values(tmp_path: Path) -> None:
    rows = [
        {"step": 1, **BATCH, "batch/mb_tokens_max": 13, **TRAIN, "train/loss": 0.75},
        {"step": 2, **BATCH, "batch/mb_tokens_max": 13, **TRAIN, "perf/tokens_per_s": 4.5},
    ]
    fig = run_figure(RunDir.read(write_run(tmp_path / "run", rows, schedule=None)))
    panels = {ax.get_title(): ax for ax in fig.axes}
    assert list(panels) == [*BASE_TITLES, *TRAIN_TITLES]
    loss, speed = panels["Training loss"].lines[0], panels["Throughput"].lines[0]
    assert list(loss.get_xdata()) == [1, 2] and list(loss.get_ydata()) == [0.75, 0.5]
    assert list(speed.get_ydata()) == [9.0, 4.5]
    assert panels["Throughput"].get_ylim()[0] == 0  # a rate starts at 0; a loss need not


def test_tokens_panel_places_one_based_steps_on_their_numbers(tmp_path: Path) -> None:
    # Metrics numbered 1, 2 (another numbering than schedule.json's 0, 1): the i-th logged
    # step is the schedule's i-th step, drawn at its logged number.
    fig = run_figure(RunDir.read(make_run(tmp_path / "run", first_step=1)))
    tokens = fig.axes[0]
    assert list(tokens.get_xticks()) == [1, 2]
    first = dotted(tokens)[:2]  # step 1's ranks 0 and 1
    assert [list(line.get_ydata()) for line in first] == [[8, 4], [6, 2]]
    assert all(0.5 < x < 1.5 for line in first for x in line.get_xdata())
    assert [t.get_text() for t in tokens.get_legend().get_texts()] == [
        "DP rank 0",
        "DP rank 1",
        "cap = 10 tokens",
        "over the cap (1)",  # step 2, rank 0: samples 5 and 0, 13 tokens > 10
    ]


def wide_schedule(dp: int) -> dict:
    """One step in which DP rank r has two micro-batches of 2r+1 and 2r+2 tokens, except the
    last rank's second, which holds two samples of dp+1 tokens (over the cap of 2·dp)."""
    lengths = [*range(1, 2 * dp), dp + 1, dp + 1]
    ranks = [[[2 * r], [2 * r + 1]] for r in range(dp - 1)]
    ranks.append([[2 * dp - 2], [2 * dp - 1, 2 * dp]])
    return {"lengths": lengths, "cap": 2 * dp, "steps": [{"step": 0, "ranks": ranks}]}


def test_many_ranks_become_a_min_median_max_band(tmp_path: Path) -> None:
    # dp=9: first micro-batches 1,3,...,17 tokens, second ones 2,4,...,16 and 20 (over cap 18).
    row = {"step": 1, **BATCH, "batch/mb_tokens_max": 20}
    fig = run_figure(RunDir.read(write_run(tmp_path / "run", [row], wide_schedule(9))))
    tokens = fig.axes[0]
    assert tokens.get_title().startswith("Micro-batch tokens over 9 DP ranks")
    (median,) = dotted(tokens)
    assert list(median.get_ydata()) == [9, 10]
    (band,) = [c for c in tokens.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert (ys.min(), ys.max()) == (1, 20)
    assert [t.get_text() for t in tokens.get_legend().get_texts()] == [
        "median of 9 DP ranks",
        "min – max over ranks",
        "cap = 18 tokens",
        "over the cap (1)",
    ]


@pytest.mark.parametrize("dp", [2, 32, 64])
def test_run_figure_stays_readable_at_many_ranks(tmp_path: Path, dp: int) -> None:
    rows = [{"step": s, **BATCH, "batch/mb_tokens_max": 20, **PLAN, **TRAIN} for s in range(1, 31)]
    schedule = wide_schedule(dp)
    schedule["steps"] = [{**schedule["steps"][0], "step": s} for s in range(30)]
    name = "0_" + ",".join(f"parallel.dp={dp},key{i}=value{i}" for i in range(6))  # 170+ chars
    fig = run_figure(RunDir.read(write_run(tmp_path / name, rows, schedule)))
    assert_readable(fig)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    ranks = (
        [f"DP rank {r}" for r in range(dp)]
        if dp <= 8
        else [
            f"median of {dp} DP ranks",
            "min – max over ranks",
        ]
    )
    assert legend == [*ranks, f"cap = {2 * dp} tokens", "over the cap (30)"]


def test_a_run_that_logged_no_step_still_gets_its_figure(tmp_path: Path) -> None:
    fig = run_figure(RunDir.read(write_run(tmp_path / "run", [])))
    assert titles(fig) == ["Micro-batch tokens per DP rank against the cap", *BASE_TITLES]


def test_sweep_jobs_in_job_number_order(tmp_path: Path) -> None:
    for name in ("10_seed=3", "2_seed=2", "0_seed=1"):
        make_run(tmp_path / name)
    (tmp_path / "report").mkdir()
    assert [p.name for p in sweep_jobs(tmp_path)] == ["0_seed=1", "2_seed=2", "10_seed=3"]


def test_failed_jobs_are_named_with_the_first_line_of_their_error(tmp_path: Path) -> None:
    make_run(tmp_path / "0_seed=1")
    write_failed(tmp_path / "1_seed=2", "\nparallel.vpp=2 needs pp > 1; set parallel.pp.\nmore\n")
    write_failed(tmp_path / "2_seed=3", None)
    (tmp_path / "report").mkdir()  # the report's own dir is no job
    failed = failed_jobs(tmp_path)
    assert [(job.name, job.has_error_file) for job in failed] == [
        ("1_seed=2", True),
        ("2_seed=3", False),
    ]
    assert failed[0].error == "parallel.vpp=2 needs pp > 1; set parallel.pp."
    assert failed[1].error.startswith("no error.txt: it stopped before logging a step")
    assert [p.name for p in sweep_jobs(tmp_path)] == ["0_seed=1"]


def test_report_of_a_run_and_of_a_sweep(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    assert [r["step"] for r in RunDir.read(run).metrics] == [0, 1]
    [png] = report(run).written
    assert png == run / "report" / "run.png" and png.stat().st_size > 10_000
    sweep = tmp_path / "sweep"
    make_run(sweep / "0_seed=1")
    make_run(sweep / "1_seed=2")
    done = report(sweep, tmp_path / "out")
    assert [p.name for p in done.written] == ["sweep.png", "0_seed=1.png", "1_seed=2.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in done.written)
    assert done.failed == [] and not (tmp_path / "out" / FAILED_FILE).exists()


def test_report_lists_a_sweeps_failed_jobs(tmp_path: Path, capsys) -> None:
    sweep = tmp_path / "sweep"
    make_run(sweep / "0_parallel.vpp=1,seed=1")
    write_failed(sweep / "1_parallel.vpp=2,seed=1", "parallel.vpp=2 needs parallel.pp > 1\n")
    main([str(sweep)])
    out = capsys.readouterr().out.splitlines()
    listing = (sweep / "report" / FAILED_FILE).read_text().splitlines()
    assert listing == [
        f"{sweep}: 1 of 2 jobs failed (no metrics.jsonl):",
        "  1_parallel.vpp=2,seed=1",
        "    parallel.vpp=2 needs parallel.pp > 1",
        f"    {sweep / '1_parallel.vpp=2,seed=1'}",
    ]
    assert out == [
        str(sweep / "report" / "sweep.png"),
        str(sweep / "report" / "0_parallel.vpp=1,seed=1.png"),
        str(sweep / "report" / FAILED_FILE),
        *listing,
    ]


def test_sweep_figure_counts_and_marks_failed_jobs(tmp_path: Path) -> None:
    runs = [RunDir.read(make_run(tmp_path / "0_parallel.vpp=1,seed=1"))]
    failed = failed_jobs(write_failed(tmp_path / "1_parallel.vpp=2,seed=1", "bad vpp\n").parent)
    fig = sweep_figure(runs, "sw", failed)
    assert fig._suptitle.get_text().splitlines() == [
        "Sweep sw: 2 jobs, 1 failed (no metrics; their errors: failed_jobs.txt)",
        "all with seed=1",
    ]
    first = fig.axes[0]
    assert [t.get_text() for t in first.get_yticklabels()] == ["parallel.vpp=1", "parallel.vpp=2"]
    assert [t.get_text() for t in first.texts] == ["2.0", "failed: no metrics"]  # bar, note
    assert_readable(fig)


def test_sweep_panels_add_the_metrics_some_job_logged(tmp_path: Path) -> None:
    plan = write_run(tmp_path / "0_trainer=plan", [{"step": 1, **BATCH, **PLAN}])
    cpu = write_run(tmp_path / "1_trainer=cpu", [{"step": 1, **BATCH, **TRAIN}])
    panels = sweep_panels([RunDir.read(plan), RunDir.read(cpu)])
    assert [(p.title, p.values) for p in panels[4:]] == [
        ("training loss (last step)", [None, 0.5]),
        ("tokens / s (mean over steps)", [None, 9.0]),
        ("simulated step time (mean s)", [0.5, None]),
        ("pipeline bubble (mean idle share)", [0.25, None]),
    ]
    assert [p.values for p in panels[:4]] == [[2, 2], [1.0, 1.0], [0, 0], [0, 0]]


def ended(sweep: Path, job: Path, failed: bool | None) -> Path:
    """A job of a sweep as the app reports it: started, then (unless None) ended."""
    note_sweep_job(sweep, job, None)
    if failed is not None:
        note_sweep_job(sweep, job, failed)
    return job


def test_sweep_line_counts_jobs_and_names_failed_ones(tmp_path: Path) -> None:
    assert sweep_line(tmp_path / "none") == f"sweep: 0 jobs ({tmp_path / 'none'} does not exist)"
    ended(tmp_path, make_run(tmp_path / "0_seed=1"), False)
    ended(tmp_path, make_run(tmp_path / "2_seed=3"), False)
    assert sweep_line(tmp_path) == f"sweep: 2 jobs, 0 failed ({tmp_path})"
    ended(tmp_path, write_failed(tmp_path / "1_seed=2", "bad\n"), True)
    ended(tmp_path, write_failed(tmp_path / "3_seed=4", None), None)  # killed: never ended
    assert sweep_line(tmp_path) == (
        f"sweep: 4 jobs, 2 failed (see {tmp_path / '1_seed=2' / 'error.txt'}, "
        f"{tmp_path / '3_seed=4'})"
    )
    for n in (4, 5):
        ended(tmp_path, write_failed(tmp_path / f"{n}_seed={n + 1}", "bad\n"), True)
    assert sweep_line(tmp_path) == f"sweep: 6 jobs, 4 failed (see {tmp_path}/*/error.txt)"


def test_the_sweep_line_counts_outcomes_not_files_and_only_this_sweeps_jobs(tmp_path) -> None:
    # An earlier sweep's job; then this sweep's: one refused in a dir holding a run (metrics,
    # no error.txt), one failed in training (metrics and error.txt), one nested by a "/" value.
    ended(tmp_path, make_run(tmp_path / "0_seed=1"), False)
    offset = (tmp_path / SWEEP_JOBS).stat().st_size
    refused = ended(tmp_path, make_run(tmp_path / "1_seed=2"), True)
    crashed = ended(tmp_path, make_run(tmp_path / "2_seed=3"), True)
    (crashed / "error.txt").write_text("RuntimeError: boom\n")
    ended(tmp_path, make_run(tmp_path / "3_data.path=" / "tmp" / "x.jsonl"), False)
    assert sweep_line(tmp_path, offset) == (
        f"sweep: 3 jobs, 2 failed (see {refused}, {crashed / 'error.txt'})"
    )


def test_jobs_sharing_a_dir_are_each_counted(tmp_path) -> None:
    """A sweeper that is not the basic one (whose shared dirs are refused before any job) with
    a fixed hydra.sweep.subdir: one job ran, one was refused there, one was killed there; and
    two jobs ran side by side in another dir, their lines interleaved."""
    same = make_run(tmp_path / "same")
    for failed in (False, True, None):
        ended(tmp_path, same, failed)
    other = tmp_path / "other"
    note_sweep_job(tmp_path, other, None)
    note_sweep_job(tmp_path, other, None)
    note_sweep_job(tmp_path, other, True)
    note_sweep_job(tmp_path, other, False)
    assert sweep_line(tmp_path) == f"sweep: 5 jobs, 3 failed (see {same}, {other})"


def test_the_callback_prints_the_line_for_this_sweep_and_keeps_an_earlier_multirun_yaml(
    tmp_path: Path, capsys
) -> None:
    ended(tmp_path, make_run(tmp_path / "0_seed=1"), False)
    (tmp_path / "multirun.yaml").write_text("earlier: sweep\n")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    summary = SweepSummary()
    summary.on_multirun_start(config=config, config_name="config")
    assert (tmp_path / "multirun.1.yaml").read_text() == "earlier: sweep\n"
    assert not (tmp_path / "multirun.yaml").exists()  # Hydra writes this sweep's now
    ended(tmp_path, make_run(tmp_path / "0_seed=2"), False)
    ended(tmp_path, write_failed(tmp_path / "1_seed=3", "bad\n"), True)
    capsys.readouterr()
    summary.on_multirun_end(config=config, config_name="config")
    assert capsys.readouterr().out == (
        f"sweep: 2 jobs, 1 failed (see {tmp_path / '1_seed=3' / 'error.txt'})\n"
    )


def test_report_refuses_a_dir_without_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="neither a run dir"):
        report(tmp_path)


def test_the_callback_counts_jobs_of_this_sweep_that_wrote_no_line(tmp_path: Path, capsys) -> None:
    """A job that stopped before its start line (killed while Hydra set it up: its dir holds
    only the job's log) failed; one that could not write its lines but ran (metrics, no
    error.txt) succeeded; an earlier sweep's job without lines is not this sweep's."""
    make_run(tmp_path / "old")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    summary = SweepSummary()
    summary.on_multirun_start(config=config, config_name="config")
    ended(tmp_path, make_run(tmp_path / "0_seed=1"), False)
    killed = tmp_path / "1_seed=2"
    killed.mkdir()
    (killed / "slime_hydra.log").write_text("")
    make_run(tmp_path / "2_seed=3")
    capsys.readouterr()
    summary.on_multirun_end(config=config, config_name="config")
    assert capsys.readouterr().out == f"sweep: 3 jobs, 1 failed (see {killed})\n"
