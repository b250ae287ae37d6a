"""The report's figures: one per run (tokens against the cap, counts, imbalance, then loss,
throughput, simulated step time and bubble when logged), one per sweep (its jobs side by side,
failed ones named). Beyond MAX_RANK_LINES DP ranks, ranks are summarised as min/median/max."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import write_file
from slime_hydra.report.panels import (
    COUNT_KEYS,
    IMBALANCE_KEYS,
    StepPanel,
    logged,
    plotted_keys,
    step_panels,
    sweep_value,
)
from slime_hydra.report.rundir import FailedJob, RunDir, run_summary
from slime_hydra.schedule import Schedule, breaks_cap

CAP_COLOR = "#d62728"
OVER_COLOR = "#d62728"
LB_COLOR = "#222222"
BAND_COLOR = "#1f77b4"
RANK_COLORS = plt.get_cmap("tab10").colors
MAX_RANK_LINES = 8
"""Up to this many DP ranks the tokens panel draws each rank; beyond, their min/median/max."""
MAX_STEP_TICKS = 16
"""Up to this many steps every step gets a tick; beyond, matplotlib picks integer ticks."""
TITLE_WIDTH = 110
LABEL_WIDTH = 36


def wrap_overrides(text: str, width: int) -> str:
    """Break a comma-separated override list into lines of at most `width` characters (an
    override longer than that keeps its own line), so long job names are not clipped."""
    lines: list[str] = []
    for part in text.split(","):
        if lines and len(lines[-1]) + 1 + len(part) <= width:
            lines[-1] += "," + part
        else:
            lines.append(part)
    return ",\n".join(lines)


def _overrides(name: str) -> list[str]:
    """A sweep job dir's overrides (its name without the job number)."""
    return name.split("_", 1)[-1].split(",")


def shared_overrides(names: Sequence[str]) -> list[str]:
    """The overrides every job of a sweep has (none when there is one job)."""
    if len(names) < 2:
        return []
    first, *rest = (_overrides(name) for name in names)
    return [o for o in first if all(o in other for other in rest)]


def job_labels(names: Sequence[str]) -> list[str]:
    """Short labels for sweep jobs: their overrides without the ones every job shares."""
    shared = shared_overrides(names)
    labels = [",".join(o for o in _overrides(name) if o not in shared) for name in names]
    return [label or name for label, name in zip(labels, names, strict=True)]


def _step_axis(ax: Axes, steps: Sequence[int]) -> None:
    """A tick per step for short runs, integer ticks chosen by matplotlib for long ones."""
    if len(steps) <= MAX_STEP_TICKS:
        ax.set_xticks(list(steps))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _positions(x: float, width: float, count: int) -> list[float]:
    """`count` evenly spread x positions in [x, x + width)."""
    return [x + width * (m + 0.5) / count for m in range(count)]


def _run_steps(run: RunDir) -> list[tuple[int, int]]:
    """(logged step number, index into schedule.json's steps) of the run's steps: the run
    trained the schedule's first len(metrics) steps in order, whatever number its first has."""
    assert run.schedule is not None
    count = min(len(run.metrics), len(run.schedule.steps))
    return [(run.metrics[i]["step"], i) for i in range(count)]


def _tokens(schedule: Schedule, index: int) -> list[list[int]]:
    """Tokens per rank per micro-batch of the `index`-th step of schedule.json."""
    return schedule.steps[index].microbatch_tokens(schedule.lengths)


def _over_cap(schedule: Schedule, index: int) -> list[list[bool]]:
    """Per rank, per micro-batch of the `index`-th step: whether it breaks the cap."""
    ranks = schedule.steps[index].ranks
    tokens = _tokens(schedule, index)
    return [
        [breaks_cap(len(mb), t, schedule.cap) for mb, t in zip(rank, ts, strict=True)]
        for rank, ts in zip(ranks, tokens, strict=True)
    ]


def _rank_lines(ax: Axes, run: RunDir) -> tuple[list[Artist], list[str], list[tuple[float, int]]]:
    """Each rank's micro-batch tokens as a line of dots inside its slot of the step; returns
    legend handles, labels and the (x, tokens) of micro-batches over the cap."""
    schedule = run.schedule
    assert schedule is not None
    dp = len(schedule.steps[0].ranks)
    slot = 0.8 / dp
    over: list[tuple[float, int]] = []
    for step, index in _run_steps(run):
        flags = _over_cap(schedule, index)
        for r, tokens in enumerate(_tokens(schedule, index)):
            xs = _positions(step - 0.4 + r * slot, slot, max(len(tokens), 1))[: len(tokens)]
            color = RANK_COLORS[r % len(RANK_COLORS)]
            ax.plot(xs, tokens, "-o", color=color, ms=3.5, lw=0.8, alpha=0.85)
            over += [(x, t) for x, t, f in zip(xs, tokens, flags[r], strict=True) if f]
    handles: list[Artist] = [
        Line2D([], [], color=RANK_COLORS[r % len(RANK_COLORS)], marker="o", ms=4, lw=0.8)
        for r in range(dp)
    ]
    return handles, [f"DP rank {r}" for r in range(dp)], over


def _rank_band(ax: Axes, run: RunDir) -> tuple[list[Artist], list[str], list[tuple[float, int]]]:
    """For each micro-batch position of each step, the min–max band and the median of the
    ranks' tokens; returns legend handles, labels and the micro-batches over the cap."""
    schedule = run.schedule
    assert schedule is not None
    dp = len(schedule.steps[0].ranks)
    over: list[tuple[float, int]] = []
    for step, index in _run_steps(run):
        tokens = _tokens(schedule, index)
        flags = _over_cap(schedule, index)
        count = max((len(t) for t in tokens), default=0)
        xs = _positions(step - 0.4, 0.8, max(count, 1))[:count]
        columns = [[t[m] for t in tokens if m < len(t)] for m in range(count)]
        lows, highs = [min(c) for c in columns], [max(c) for c in columns]
        ax.fill_between(xs, lows, highs, color=BAND_COLOR, alpha=0.25, lw=0)
        ax.plot(xs, [statistics.median(c) for c in columns], "-o", color=BAND_COLOR, ms=3, lw=1)
        for t, f in zip(tokens, flags, strict=True):
            over += [(xs[m], t[m]) for m in range(len(t)) if f[m]]
    handles: list[Artist] = [
        Line2D([], [], color=BAND_COLOR, marker="o", ms=4, lw=1),
        Patch(color=BAND_COLOR, alpha=0.25, lw=0),
    ]
    return handles, [f"median of {dp} DP ranks", "min – max over ranks"], over


def _tokens_panel(ax: Axes, run: RunDir) -> None:
    """Micro-batch tokens per step against the cap: each rank's micro-batches left to right
    (a few ranks), or their min/median/max over ranks (many), with the cap and breaches."""
    schedule = run.schedule
    assert schedule is not None and schedule.steps
    dp = len(schedule.steps[0].ranks)
    per_rank = dp <= MAX_RANK_LINES
    handles, labels, over = (_rank_lines if per_rank else _rank_band)(ax, run)
    steps = [step for step, _ in _run_steps(run)]
    top = max(
        (max(ts, default=0) for _, i in _run_steps(run) for ts in _tokens(schedule, i)), default=1
    )
    if schedule.cap is not None:
        top = max(top, schedule.cap)
        ax.axhline(schedule.cap, color=CAP_COLOR, ls="--", lw=1.5)
        handles.append(Line2D([], [], color=CAP_COLOR, ls="--", lw=1.5))
        labels.append(f"cap = {schedule.cap:,} tokens")
    if over:
        ax.scatter(*zip(*over, strict=True), s=70, facecolors="none", edgecolors=OVER_COLOR, lw=1.5)
        handles.append(Line2D([], [], marker="o", ls="", mfc="none", mec=OVER_COLOR, ms=8, mew=1.5))
        labels.append(f"over the cap ({len(over)})")
    _step_axis(ax, steps)
    ax.set_xlim(min(steps, default=0) - 0.5, max(steps, default=0) + 0.5)
    if len(steps) <= 4 * MAX_STEP_TICKS:
        for step in steps[1:]:
            ax.axvline(step - 0.5, color="#dddddd", lw=0.8, zorder=0)
    ax.set_ylim(0, top * 1.1)
    ax.set_xlabel(
        "step (each rank's micro-batches left to right)"
        if per_rank
        else "step (micro-batches left to right)"
    )
    ax.set_ylabel("tokens per micro-batch")
    ax.set_title(
        "Micro-batch tokens per DP rank against the cap"
        if per_rank
        else f"Micro-batch tokens over {dp} DP ranks (min, median, max) against the cap"
    )
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)


def _count_panel(ax: Axes, run: RunDir) -> None:
    """Micro-batches per rank each step, next to the lower bound any cap-safe schedule needs."""
    count, bound, empty = COUNT_KEYS
    steps, counts = logged(run.metrics, count)
    ax.bar(steps, counts, width=0.6, color="#1f77b4", label="micro-batches per rank")
    lower = logged(run.metrics, bound)
    if lower[0]:
        width = 500 * min(1.0, MAX_STEP_TICKS / max(len(steps), 1))  # within a bar's slot
        ax.scatter(*lower, marker="_", s=width, lw=2.5, color=LB_COLOR, zorder=3)
        ax.scatter([], [], marker="_", s=120, lw=2.5, color=LB_COLOR, label="lower bound")
    empties = logged(run.metrics, empty)
    if any(empties[1]):
        ax.bar(*empties, width=0.6, color="#ff7f0e", label="empty micro-batches (all ranks)")
    _step_axis(ax, steps)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("micro-batches")
    ax.set_title("Micro-batches per step")
    ax.legend(loc="lower right", fontsize=8)


def _imbalance_panel(ax: Axes, run: RunDir) -> None:
    """Token and FLOPs imbalance (max / mean) of micro-batches and DP ranks over the steps;
    1.0 is perfect."""
    steps: list[int] = []
    for key, label in IMBALANCE_KEYS:
        at, values = logged(run.metrics, key)
        if at:
            ax.plot(at, values, "-o", ms=4, label=label)
            steps = sorted({*steps, *at})
    ax.axhline(1.0, color="#888888", ls=":", lw=1, label="perfect balance")
    _step_axis(ax, steps)
    ax.set_xlabel("step")
    ax.set_ylabel("imbalance (max / mean)")
    ax.set_title("Imbalance over steps")
    ax.legend(fontsize=8)


def _metric_panel(ax: Axes, run: RunDir, panel: StepPanel) -> None:
    """One logged metric over the steps that logged it."""
    steps, values = logged(run.metrics, panel.key)
    ax.plot(steps, values, "-o", ms=4, color="#2ca02c")
    if panel.from_zero:
        ax.set_ylim(0, max((v for v in values if math.isfinite(v)), default=0) * 1.1 or 1)
    _step_axis(ax, steps)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.set_title(panel.title)


def run_figure(run: RunDir, title: str | None = None) -> Figure:
    """One run's figure: tokens against the cap (from schedule.json), counts and imbalance,
    then one panel per logged metric of STEP_PANELS, two to a row. Before its first step a run
    gets the count and imbalance panels empty; a panel whose metrics the run's steps do not log
    (a hand-written metrics.jsonl) is left out, and a run with none of them is our error."""
    draw: list[Callable[[Axes], None]] = []
    if not run.metrics or logged(run.metrics, COUNT_KEYS[0])[0]:
        draw.append(partial(_count_panel, run=run))
    if not run.metrics or any(logged(run.metrics, key)[0] for key, _ in IMBALANCE_KEYS):
        draw.append(partial(_imbalance_panel, run=run))
    draw += [partial(_metric_panel, run=run, panel=panel) for panel in step_panels(run.metrics)]
    tokens = run.schedule is not None and bool(run.schedule.steps)
    if not draw and not tokens:
        raise SlimeHydraError(
            f"{run.path / 'metrics.jsonl'} logs none of the metrics the report plots "
            f"({', '.join(sorted(plotted_keys()))}) and the run dir has no schedule.json: "
            "there is nothing to plot."
        )
    rows = math.ceil(len(draw) / 2)
    ratios = [1.3] * tokens + [1.0] * rows
    fig = plt.figure(figsize=(12, 1.2 + 3.3 * sum(ratios)), layout="constrained")
    grid = fig.add_gridspec(len(ratios), 2, height_ratios=ratios)
    if tokens:
        _tokens_panel(fig.add_subplot(grid[0, :]), run)
    for i, panel in enumerate(draw):
        panel(fig.add_subplot(grid[tokens + i // 2, i % 2]))
    fig.suptitle(wrap_overrides(title or run.name, TITLE_WIDTH), fontsize=12, fontweight="bold")
    return fig


def _save(fig: Figure, path: Path) -> Path:
    """Write the figure as PNG, complete or absent, never through a link (files.write_file)."""
    try:
        write_file(path, lambda f: fig.savefig(f, format="png", dpi=110), path.parent)
    finally:
        plt.close(fig)
    return path


def plot_run(run: RunDir, path: Path, title: str | None = None) -> Path:
    """Write run_figure(run) to `path`."""
    return _save(run_figure(run, title), path)


@dataclass(frozen=True)
class SweepPanel:
    """One number per job (None: the job has none), bars side by side."""

    title: str
    fmt: str
    values: list[float | None]
    floor: float = 0.0
    """Where the bars start (1.0 for an imbalance, whose best value is 1)."""
    integer: bool = False
    lower: list[float] | None = None
    """A lower bound per job, drawn as a tick on its bar (the micro-batch count's)."""


def sweep_panels(runs: Sequence[RunDir]) -> list[SweepPanel]:
    """The sweep figure's panels: the schedule's numbers, then each STEP_PANELS metric that
    at least one job logged."""
    summaries = [run_summary(run.metrics) for run in runs]

    def summary(key: str) -> list[float | None]:
        return [s.get(key) for s in summaries]

    bounds = summary("num_microbatches_lb_mean")
    panels = [
        SweepPanel(
            "micro-batches per rank per step (mean)",
            "{:.1f}",
            summary("num_microbatches_mean"),
            integer=True,
            lower=bounds if all(b is not None for b in bounds) else None,
        ),
        SweepPanel(
            "micro-batch token imbalance (mean max/mean)",
            "{:.3f}",
            summary("token_imbalance_mean"),
            floor=1.0,
        ),
        SweepPanel(
            "micro-batches over the cap (all steps)",
            "{:.0f}",
            summary("cap_violations_total"),
            integer=True,
        ),
        SweepPanel(
            "empty micro-batches (all steps)",
            "{:.0f}",
            summary("empty_microbatches_total"),
            integer=True,
        ),
    ]
    every_row = [row for run in runs for row in run.metrics]
    panels += [
        SweepPanel(p.sweep_title, p.fmt, [sweep_value(run.metrics, p) for run in runs])
        for p in step_panels(every_row)
    ]
    return [panel for panel in panels if any(v is not None for v in panel.values)]


def _sweep_panel(ax: Axes, panel: SweepPanel, labels: Sequence[str], failed: int) -> None:
    """Horizontal bars, one per job; the last `failed` rows are failed jobs, marked as such."""
    values = panel.values + [None] * failed
    ys = list(range(len(values)))
    shown = [(y, v) for y, v in zip(ys, values, strict=True) if v is not None and math.isfinite(v)]
    colors = [RANK_COLORS[y % len(RANK_COLORS)] for y, _ in shown]
    if shown:
        bars = ax.barh(
            [y for y, _ in shown],
            [v - panel.floor for _, v in shown],
            left=panel.floor,
            color=colors,
            height=0.6,
        )
        ax.bar_label(bars, [panel.fmt.format(v) for _, v in shown], padding=3, fontsize=9)
    lower = panel.lower
    if lower is not None:
        ax.scatter(lower, ys[: len(lower)], marker="|", s=400, lw=2.5, color=LB_COLOR, zorder=3)
    for y in ys[len(ys) - failed :]:
        ax.annotate(
            "failed: no metrics",
            (0.01, y),
            xycoords=("axes fraction", "data"),
            va="center",
            color=OVER_COLOR,
            fontsize=9,
        )
    numbers = [v for _, v in shown]
    top = max([*numbers, panel.floor + (1 if panel.integer else 0.001)])
    low = min([*numbers, panel.floor])
    span = top - low
    ax.set_xlim(low - 0.05 * span if low < panel.floor else low, top + 0.25 * span)
    if panel.integer:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yticks(ys, labels, fontsize=9)
    for tick in ax.get_yticklabels()[len(ys) - failed :]:
        tick.set_color(OVER_COLOR)
    ax.set_ylim(len(ys) - 0.5, -0.5)
    ax.set_title(panel.title + ("; black tick: lower bound" if lower is not None else ""))


def sweep_figure(runs: Sequence[RunDir], title: str, failed: Sequence[FailedJob] = ()) -> Figure:
    """The sweep's jobs side by side, one bar each per panel; failed jobs get a red row and
    are counted in the title (their errors go to failed_jobs.txt beside the figure)."""
    names = [run.name for run in runs] + [job.name for job in failed]
    labels = [wrap_overrides(label, LABEL_WIDTH) for label in job_labels(names)]
    panels = sweep_panels(runs)
    if not panels:
        raise SlimeHydraError(
            f"no job of sweep {title} logs a metric the report plots "
            f"({', '.join(sorted(plotted_keys()))}): there is nothing to compare."
        )
    lines = sum(label.count("\n") + 1 for label in labels)
    row_height = 1.6 + 0.3 * lines + 0.15 * len(labels)
    rows = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(
        rows, 2, figsize=(13, 0.8 + rows * row_height), layout="constrained", squeeze=False
    )
    for ax, panel in zip(axes.flat, panels, strict=False):
        _sweep_panel(ax, panel, labels, len(failed))
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    heading = f"Sweep {title}: {len(names)} jobs"
    if failed:
        heading += f", {len(failed)} failed (no metrics; their errors: failed_jobs.txt)"
    shared = shared_overrides(names)
    if shared:
        heading += "\n" + wrap_overrides("all with " + ",".join(shared), TITLE_WIDTH)
    fig.suptitle(heading, fontsize=12)
    return fig


def plot_sweep(
    runs: Sequence[RunDir], path: Path, title: str, failed: Sequence[FailedJob] = ()
) -> Path:
    """Write sweep_figure(runs, title, failed) to `path`."""
    return _save(sweep_figure(runs, title, failed), path)
