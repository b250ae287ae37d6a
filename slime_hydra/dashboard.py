"""`python -m slime_hydra.dashboard --project P [--entity E] [--swept KEY ...] [--online]`: a
saved W&B workspace for slime_hydra runs, built with wandb-workspaces.

Sections: the schedule (micro-batches per step against the lower bound, the largest micro-batch
against its bound and the cap, token and FLOPs imbalance, cap violations and empty
micro-batches), training (loss, grad norm, tokens/s, predicted against measured step time) and
sweeps (runs grouped by their wandb group, the sweep dir, and a parallel-coordinates panel over
the swept config keys). Offline (the default) it writes the spec as JSON and prints how to
create the workspace online; `--online` saves it to W&B.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STEP = "step"
"""The x axis of every line plot: the wandb sink logs each metric against `step`."""

CAP = "${batch/mb_tokens_mean} / ${batch/cap_utilization}"
"""The cap as an expression of logged keys (utilization = mean micro-batch / cap): the cap
itself (max_tokens_per_gpu × cp) is config, not a logged series."""

SWEPT = ("batching.max_tokens_per_gpu", "parallel.dp", "parallel.cp", "parallel.vpp")
"""Config keys the parallel-coordinates panel spans unless `--swept` names others."""

OUTCOMES = (
    "summary/num_microbatches_mean",
    "summary/token_imbalance_mean",
    "summary/cap_violations_total",
    "sim/step_s",
    "perf/tokens_per_s",
)
"""Per-run numbers at the end of the parallel-coordinates panel (summary or last value)."""


@dataclass(frozen=True)
class Line:
    """Line plot of logged keys over `step`; with `grouped`, one mean line (min-max band) per
    wandb group."""

    title: str
    keys: tuple[str, ...]
    expressions: tuple[str, ...] = ()
    grouped: bool = False


@dataclass(frozen=True)
class Parallel:
    """Parallel coordinates: one line per run across config keys, then summary numbers."""

    title: str
    config: tuple[str, ...]
    summary: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    name: str
    panels: tuple[Line | Parallel, ...]


@dataclass(frozen=True)
class Dashboard:
    """The workspace, independent of wandb-workspaces: what the offline file holds."""

    project: str
    entity: str | None
    name: str
    sections: tuple[Section, ...]

    def to_json(self) -> dict[str, Any]:
        """The spec as JSON, each panel tagged with its kind."""
        doc = asdict(self)
        for section, spec in zip(self.sections, doc["sections"], strict=True):
            for panel, entry in zip(section.panels, spec["panels"], strict=True):
                entry["kind"] = type(panel).__name__.lower()
        return doc


def dashboard(project: str, entity: str | None = None, swept: tuple[str, ...] = SWEPT) -> Dashboard:
    """The slime_hydra workspace for `project`, its sweep panel over the config keys `swept`."""
    schedule = Section(
        "Schedule",
        (
            Line(
                "Micro-batches per step against the lower bound",
                ("batch/num_microbatches", "batch/num_microbatches_lb"),
            ),
            Line(
                "Largest micro-batch against its bound and the cap (tokens)",
                ("batch/mb_tokens_max", "batch/mb_tokens_lb"),
                expressions=(CAP,),
            ),
            Line(
                "Token imbalance (max / mean)",
                ("batch/token_imbalance", "batch/dp_token_imbalance"),
            ),
            Line(
                "FLOPs imbalance (max / mean)",
                ("batch/flops_imbalance", "batch/dp_flops_imbalance"),
            ),
            Line(
                "Cap violations and empty micro-batches (0 when sound)",
                ("batch/cap_violations", "batch/empty_microbatches"),
            ),
        ),
    )
    training = Section(
        "Training",
        (
            Line("Loss", ("train/loss",)),
            Line("Gradient norm", ("train/grad_norm",)),
            Line("Throughput (tokens / s)", ("perf/tokens_per_s",)),
            Line(
                "Step time: predicted (plan mode) against measured (s)",
                ("sim/step_s", "perf/step_s"),
            ),
        ),
    )
    sweeps = Section(
        "Sweeps",
        (
            Parallel("Swept settings and what they gave", tuple(swept), OUTCOMES),
            Line("Step time by sweep (s)", ("sim/step_s", "perf/step_s"), grouped=True),
            Line(
                "Micro-batches per step by sweep",
                ("batch/num_microbatches", "batch/num_microbatches_lb"),
                grouped=True,
            ),
        ),
    )
    return Dashboard(project, entity, "slime_hydra", (schedule, training, sweeps))


def workspace(spec: Dashboard) -> Any:
    """The wandb-workspaces Workspace of `spec` (built offline; `.save()` needs W&B)."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    def panel(p: Line | Parallel) -> Any:
        if isinstance(p, Parallel):
            columns = [wr.Config(key) for key in p.config] + [
                wr.SummaryMetric(k) for k in p.summary
            ]
            return wr.ParallelCoordinatesPlot(
                title=p.title,
                columns=[wr.ParallelCoordinatesPlotColumn(metric=c) for c in columns],
            )
        group = {"groupby": "Group", "groupby_aggfunc": "mean", "groupby_rangefunc": "minmax"}
        return wr.LinePlot(
            title=p.title,
            x=STEP,
            y=list(p.keys),
            custom_expressions=list(p.expressions) or None,
            **(group if p.grouped else {}),
        )

    return ws.Workspace(
        entity=spec.entity or "",
        project=spec.project,
        name=spec.name,
        settings=ws.WorkspaceSettings(x_axis=STEP),
        sections=[
            ws.Section(name=s.name, panels=[panel(p) for p in s.panels], is_open=True)
            for s in spec.sections
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slime_hydra.dashboard",
        description="Build the slime_hydra W&B workspace: offline a JSON spec, or --online.",
    )
    parser.add_argument("--project", required=True, help="the W&B project the runs log to")
    parser.add_argument("--entity", help="the W&B entity (team or user); needed --online")
    parser.add_argument(
        "--swept", nargs="+", default=list(SWEPT), help="config keys a sweep varies"
    )
    parser.add_argument("--out", type=Path, default=Path("wandb_workspace.json"))
    parser.add_argument("--online", action="store_true", help="save the workspace to W&B")
    args = parser.parse_args(argv)
    spec = dashboard(args.project, args.entity, tuple(args.swept))
    if args.online:
        if not args.entity:
            parser.error("--online needs --entity (the team or user that owns the project)")
        saved = workspace(spec).save()
        print(f"Saved the workspace: {saved.url}")
        return 0
    args.out.write_text(json.dumps(spec.to_json(), indent=2) + "\n")
    entity = args.entity or "ENTITY"
    swept = " ".join(args.swept)
    print(
        f"Wrote the workspace spec to {args.out}. To create it in W&B (needs network and "
        f"WANDB_API_KEY):\n  python -m slime_hydra.dashboard --project {args.project} "
        f"--entity {entity} --swept {swept} --online"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
