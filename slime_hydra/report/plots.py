"""The report's figures: one per run (tokens against the cap, counts, imbalance), one per sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from slime_hydra.report.rundir import RunDir, run_summary
from slime_hydra.schedule import breaks_cap

CAP_COLOR = "#d62728"
OVER_COLOR = "#d62728"
LB_COLOR = "#222222"
RANK_COLORS = plt.get_cmap("tab10").colors


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


def _tokens_panel(ax: Axes, run: RunDir) -> None:
    """Each micro-batch's tokens as a dot, grouped by step then rank, with the cap line."""
    schedule = run.schedule
    assert schedule is not None
    steps = [row["step"] for row in run.metrics if row["step"] < len(schedule.steps)]
    dp = len(schedule.steps[0].ranks) if schedule.steps else 1
    slot = 0.8 / dp
    over_x: list[float] = []
    over_y: list[int] = []
    for step in steps:
        ranks = schedule.steps[step].ranks
        for r, tokens in enumerate(schedule.microbatch_tokens(step)):
            k = max(len(tokens), 1)
            left = step - 0.4 + r * slot
            xs = [left + slot * (m + 0.5) / k for m in range(len(tokens))]
            color = RANK_COLORS[r % len(RANK_COLORS)]
            ax.plot(xs, tokens, "-o", color=color, ms=3.5, lw=0.8, alpha=0.85)
            for x, t, mb in zip(xs, tokens, ranks[r], strict=True):
                if breaks_cap(len(mb), t, schedule.cap):
                    over_x.append(x)
                    over_y.append(t)
    handles = [
        Line2D([], [], color=RANK_COLORS[r % len(RANK_COLORS)], marker="o", ms=4, lw=0.8)
        for r in range(dp)
    ]
    labels = [f"DP rank {r}" for r in range(dp)]
    top = max((row["batch/mb_tokens_max"] for row in run.metrics), default=1)
    if schedule.cap is not None:
        top = max(top, schedule.cap)
        ax.axhline(schedule.cap, color=CAP_COLOR, ls="--", lw=1.5)
        ax.annotate(
            f"cap {schedule.cap:,}",
            (1.0, schedule.cap),
            xycoords=("axes fraction", "data"),
            xytext=(-4, 3),
            textcoords="offset points",
            ha="right",
            va="bottom",
            color=CAP_COLOR,
            fontsize=9,
        )
        handles.append(Line2D([], [], color=CAP_COLOR, ls="--", lw=1.5))
        labels.append(f"cap = {schedule.cap:,} tokens")
    if over_x:
        ax.scatter(over_x, over_y, s=70, facecolors="none", edgecolors=OVER_COLOR, lw=1.5)
        handles.append(Line2D([], [], marker="o", ls="", mfc="none", mec=OVER_COLOR, ms=8, mew=1.5))
        labels.append(f"over the cap ({len(over_x)})")
    ax.set_xticks(steps)
    ax.set_xlim(min(steps, default=0) - 0.5, max(steps, default=0) + 0.5)
    for step in steps[1:]:
        ax.axvline(step - 0.5, color="#dddddd", lw=0.8, zorder=0)
    ax.set_ylim(0, top * 1.1)
    ax.set_xlabel("step (each rank's micro-batches left to right)")
    ax.set_ylabel("tokens per micro-batch")
    ax.set_title("Micro-batch tokens per DP rank against the cap")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)


def _count_panel(ax: Axes, run: RunDir) -> None:
    """Micro-batches per rank each step, next to the lower bound any cap-safe schedule needs."""
    steps = [row["step"] for row in run.metrics]
    counts = [row["batch/num_microbatches"] for row in run.metrics]
    ax.bar(steps, counts, width=0.6, color="#1f77b4", label="micro-batches per rank")
    lower = [row.get("batch/num_microbatches_lb") for row in run.metrics]
    if all(v is not None for v in lower):
        ax.scatter(steps, lower, marker="_", s=500, lw=2.5, color=LB_COLOR, zorder=3)
        ax.scatter([], [], marker="_", s=120, lw=2.5, color=LB_COLOR, label="lower bound")
    empty = [row.get("batch/empty_microbatches") or 0 for row in run.metrics]
    if any(empty):
        ax.bar(steps, empty, width=0.6, color="#ff7f0e", label="empty micro-batches (all ranks)")
    ax.set_xticks(steps)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("micro-batches")
    ax.set_title("Micro-batches per step")
    ax.legend(loc="lower right", fontsize=8)


def _imbalance_panel(ax: Axes, run: RunDir) -> None:
    """Token and FLOPs imbalance (max / mean) of micro-batches and DP ranks over the steps;
    1.0 is perfect."""
    steps = [row["step"] for row in run.metrics]
    for key, label in (
        ("batch/token_imbalance", "micro-batch tokens"),
        ("batch/dp_token_imbalance", "DP rank tokens"),
        ("batch/flops_imbalance", "micro-batch FLOPs"),
        ("batch/dp_flops_imbalance", "DP rank FLOPs"),
    ):
        values = [row.get(key) for row in run.metrics]
        if all(v is not None for v in values):
            ax.plot(steps, values, "-o", ms=4, label=label)
    ax.axhline(1.0, color="#888888", ls=":", lw=1, label="perfect balance")
    ax.set_xticks(steps)
    ax.set_xlabel("step")
    ax.set_ylabel("imbalance (max / mean)")
    ax.set_title("Imbalance over steps")
    ax.legend(fontsize=8)


def plot_run(run: RunDir, path: Path, title: str | None = None) -> Path:
    """One run's figure: tokens against the cap (from schedule.json), counts and imbalance."""
    fig = plt.figure(figsize=(12, 8.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=(1.3, 1))
    if run.schedule is not None:
        _tokens_panel(fig.add_subplot(grid[0, :]), run)
    _count_panel(fig.add_subplot(grid[1, 0]), run)
    _imbalance_panel(fig.add_subplot(grid[1, 1]), run)
    fig.suptitle(title or run.name, fontsize=12, fontweight="bold")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(runs: Sequence[RunDir], path: Path, title: str) -> Path:
    """The sweep's jobs side by side: micro-batches, imbalance, cap violations, empty ones."""
    labels = job_labels([run.name for run in runs])
    summaries = [run_summary(run.metrics) for run in runs]
    panels = (
        ("num_microbatches_mean", "micro-batches per rank per step (mean)", "{:.1f}"),
        ("token_imbalance_mean", "micro-batch token imbalance (mean max/mean)", "{:.3f}"),
        ("cap_violations_total", "micro-batches over the cap (all steps)", "{:.0f}"),
        ("empty_microbatches_total", "empty micro-batches (all steps)", "{:.0f}"),
    )
    height = 2.2 + 0.45 * len(runs)
    fig, axes = plt.subplots(2, 2, figsize=(13, 2 * height), layout="constrained")
    colors = [RANK_COLORS[i % len(RANK_COLORS)] for i in range(len(runs))]
    ys = list(range(len(runs)))
    for ax, (key, name, fmt) in zip(axes.flat, panels, strict=True):
        values = [s.get(key, 0) for s in summaries]
        bars = ax.barh(ys, values, color=colors, height=0.6)
        ax.bar_label(bars, [fmt.format(v) for v in values], padding=3, fontsize=9)
        if key == "num_microbatches_mean":
            lower = [s.get("num_microbatches_lb_mean") for s in summaries]
            if all(v is not None for v in lower):
                ax.scatter(lower, ys, marker="|", s=400, lw=2.5, color=LB_COLOR, zorder=3)
                ax.scatter([], [], marker="|", s=100, lw=2.5, color=LB_COLOR, label="lower bound")
                ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.06), fontsize=8)
        if key == "token_imbalance_mean":
            ax.set_xlim(1.0, 1.0 + (max(values) - 1.0) * 1.25 + 0.002)
        else:
            ax.set_xlim(0, max(max(values), 1) * 1.2)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_yticks(ys, labels, fontsize=9)
        ax.invert_yaxis()
        ax.set_title(name)
    shared = shared_overrides([run.name for run in runs])
    heading = f"Sweep {title}: {len(runs)} jobs"
    fig.suptitle(heading + (f"\nall with {', '.join(shared)}" if shared else ""), fontsize=12)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
