"""The `logger=wandb` sink: one wandb run per job, offline by default, never fatal to training.

Only the process that trains logs (rank 0 under torchrun), so everything comes from `RunInfo`:
the resolved config is the run config, the sweep dir names the group, the job's overrides name
the run and the trainer mode is the job type. Each step logs the metrics as given, plus a
histogram of that step's micro-batch token counts, from the Schedule the sink is handed; close()
writes a summary and a table of every micro-batch. The run id lives in `<run dir>/wandb/run_id`:
an elastic restart or `trainer.resume` logs to the same wandb run (offline, each attempt is an
`offline-run-*` dir with that id: `wandb sync --append` them in order). Any wandb failure (no
network, bad key, bad setting) logs one warning and turns the sink off; metrics.jsonl is written
by its own sink.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from typing import Any

from slime_hydra.files import is_disk_full, write_file
from slime_hydra.log.sink import Metrics, RunInfo
from slime_hydra.log.summary import run_summary
from slime_hydra.schedule import Schedule, breaks_cap
from slime_hydra.schedule.schedule import step_index

log = logging.getLogger(__name__)

TABLE_COLUMNS = ("step", "rank", "microbatch", "samples", "tokens", "cap", "over_cap")

RUN_ID_BYTES = 128
"""The most of the stored run id file read back (wandb's ids are 8 characters)."""


def stored_run_id(run_dir: Path) -> str | None:
    """The wandb run id kept in the run dir by an earlier attempt of this run, if any."""
    path = Path(run_dir) / "wandb" / "run_id"
    if not path.is_file():
        return None
    with path.open("rb") as f:
        text = f.read(RUN_ID_BYTES).decode(errors="replace").strip()  # never a whole big file
    return text or None


def store_run_id(run_dir: Path, run_id: str) -> None:
    """Keep the run id (in the wandb dir that wandb.init made) for later attempts."""
    write_file(Path(run_dir) / "wandb" / "run_id", f"{run_id}\n", Path(run_dir))


class WandbSink:
    """Logs each step to a wandb run made from `run`; warns once and stops if wandb fails."""

    def __init__(
        self,
        run: RunInfo,
        schedule: Schedule | None = None,
        project: str = "slime_hydra",
        entity: str | None = None,
        mode: str | None = None,
        tags: list[str] | None = None,
        init_timeout: float = 60.0,
        name: str | None = None,
        notes: str | None = None,
        group: str | None = None,
    ) -> None:
        """`logger.*` settings (the config schema is derived from these arguments): `project`,
        `entity` (null: your default), `mode` (online | offline | disabled; null: WANDB_MODE
        if set, else offline), `tags`, `init_timeout` (the seconds wandb.init may wait for
        the server before the run goes on without wandb), `name` (null: the job's overrides, or
        the trainer, and the run id's first 6 characters: unique, and kept on resume), `notes`,
        and `group` (null: the sweep dir's name in a multirun). The run dir's config.yaml and
        schedule.json are saved to the run."""
        self._rows: list[Metrics] = []
        self._schedule = schedule
        self._ok = True
        self._run: Any = None
        self._dir = Path(run.run_dir) / "wandb"
        try:
            import wandb

            self._wandb = wandb
            run_id = stored_run_id(run.run_dir) or uuid.uuid4().hex[:12]
            label = run.name if run.name != "run" else run.job_type
            self._run = wandb.init(
                id=run_id,
                resume="allow",
                project=project,
                entity=entity,
                mode=mode or os.environ.get("WANDB_MODE") or "offline",
                dir=run.run_dir,
                config=run.config,
                group=group or run.group,
                name=name or f"{label}-{run_id[:6]}",
                notes=notes,
                job_type=run.job_type,
                tags=tags,
                reinit="finish_previous",
                settings=wandb.Settings(init_timeout=init_timeout),
            )
            store_run_id(run.run_dir, run_id)
            self._run.define_metric("step")
            self._run.define_metric("*", step_metric="step")
            for file in ("config.yaml", "schedule.json"):
                if (Path(run.run_dir) / file).is_file():
                    self._run.save(
                        str(Path(run.run_dir) / file), base_path=run.run_dir, policy="now"
                    )
        except Exception as exc:
            self._fail("start", exc)

    def _fail(self, action: str, exc: Exception) -> None:
        """Warn (the first time only) and stop sending to wandb; a full disk is said as such.
        wandb's own debug log lies in the run dir too: on a full disk, logging's records to it
        are dropped without a traceback each (`logging.raiseExceptions`)."""
        if self._ok and is_disk_full(exc):
            logging.raiseExceptions = False
            log.warning(
                "no space left on the device of %s: wandb could not %s; going on without it, "
                "metrics.jsonl is complete. Free space there (wandb sync uploads what it kept).",
                self._dir,
                action,
            )
        elif self._ok:
            log.warning(
                "wandb could not %s (%s: %s); going on without it, metrics.jsonl is complete",
                action,
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
            )
        self._ok = False

    def log(self, metrics: Metrics) -> None:
        """Log the step's metrics and a histogram of its micro-batch tokens (all ranks)."""
        self._rows.append(metrics)
        if not self._ok:
            return
        try:
            row = dict(metrics)
            index = step_index(metrics["step"])
            if self._schedule is not None and 0 <= index < len(self._schedule.steps):
                tokens = [t for rank in self._schedule.microbatch_tokens(index) for t in rank]
                row["batch/mb_tokens"] = self._wandb.Histogram(tokens)
            self._run.log(row)
        except Exception as exc:
            self._fail("log", exc)

    def close(self) -> None:
        """Write the run summary and the micro-batch table, then finish the run."""
        if self._ok:
            try:
                self._run.summary.update(
                    {f"summary/{k}": v for k, v in run_summary(self._rows).items()}
                )
                rows = self._microbatch_rows()
                if 0 < len(rows) <= self._wandb.Table.MAX_ROWS:
                    table = self._wandb.Table(columns=list(TABLE_COLUMNS), data=rows)
                    self._run.log({"schedule/microbatches": table})
                elif rows:
                    log.info("No wandb micro-batch table: %d rows is over its limit", len(rows))
            except Exception as exc:
                self._fail("write the summary", exc)
        if self._run is not None:
            try:
                self._run.finish()
            except Exception as exc:
                self._fail("finish", exc)
            self._run = None

    def _microbatch_rows(self) -> list[list[Any]]:
        """One row per logged micro-batch (`TABLE_COLUMNS`), from the schedule."""
        if self._schedule is None:
            return []
        cap = self._schedule.cap
        rows = []
        for metrics in self._rows:
            step, index = metrics["step"], step_index(metrics["step"])
            if not 0 <= index < len(self._schedule.steps):
                continue
            ranks = self._schedule.steps[index].ranks
            for r, rank_tokens in enumerate(self._schedule.microbatch_tokens(index)):
                for m, tokens in enumerate(rank_tokens):
                    samples = len(ranks[r][m])
                    rows.append(
                        [step, r, m, samples, tokens, cap, breaks_cap(samples, tokens, cap)]
                    )
        return rows
