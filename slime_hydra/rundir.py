"""A run dir belongs to one run: a lock, a claim that refuses another run's dir, and the
resume comparison, all before anything is written.

- `RunDirLock` holds an advisory lock (`<run dir>/.lock`, flock) for the whole run, so a
  second run into the same dir fails at once, naming the holder's pid. The kernel drops the
  lock when the holder dies, so a killed run never leaves a stale lock.
- `claim` refuses a new run into a dir that holds a run (config.yaml, schedule.json,
  metrics.jsonl or checkpoints) unless it resumes; a resume compares the dir's config.yaml
  with the new config key by key and refuses a change to anything but the keys listed below.
- `write_run_files` writes config.yaml, schedule.json and Hydra's `.hydra/` snapshot only after
  every check passed, as one set (slime_hydra.files: complete or absent, no symlink followed).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import (
    check_logs,
    file_in_the_way,
    make_dirs,
    open_append,
    read_text,
    refuse_links,
    write_files,
)

log = logging.getLogger(__name__)

LOG_FILE = "slime_hydra.log"
"""The run's log in its dir: Hydra's (conf/config.yaml's hydra.job.name names it), where rank 0's
worker appends its progress too."""

ERROR_FILE = "error.txt"
"""Why a sweep job was refused, in its dir (app.main writes it; the report and the sweep's
closing line read it)."""

LOCK_FILE = ".lock"
"""The lock a run takes on its dir before anything else (RunDirLock)."""

SWEEP_JOBS = "sweep_jobs.jsonl"
"""In a sweep dir: one line per job as it starts and one as it ends (`failed`: refused, or
failed in training), appended by each job's app (any launcher), read by the sweep's line."""

RUN_FILES = ("config.yaml", "schedule.json", "metrics.jsonl", "checkpoints")
"""What makes a dir hold a run: any of these."""

RESUME_FREE = (
    "trainer.resume",
    "trainer.max_steps",
    "trainer.save_interval",
    "trainer.max_restarts",
    "trainer.fail_at_step",
    "trainer.nproc_per_node",
    "trainer.skip_nonfinite",
    "trainer.export_hf",
    "trainer.warmup",
    "logger.",
)
"""Keys (or `prefix.`) a resume may change: how long, how often to save, where to log."""

RESUME_APPLIED = (
    "trainer.lr",
    "trainer.weight_decay",
    "trainer.clip_grad",
    "trainer.eps_clip",
    "trainer.eps_clip_high",
)
"""Optimizer keys a resume may change: the new values apply from the first resumed step (the
checkpoint's optimizer state keeps its moments, not these) and each change is logged."""

ABSENT = "<absent>"


class RunDirError(SlimeHydraError):
    """The run dir belongs to another run (or is in use): nothing of it may be touched, not
    even an error.txt in a sweep."""


def _read_fd(fd: int) -> bytes:
    return os.pread(fd, os.fstat(fd).st_size, 0)


class NoAliasLoader(yaml.SafeLoader):
    """yaml.safe_load's loader refusing aliases (`*name`): a config.yaml as the app writes it
    holds none, and a few nested ones expand to billions of nodes (the "billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None,
                None,
                "found an alias (*name), which no config.yaml of a run holds",
                self.peek_event().start_mark,
            )
        return super().compose_node(parent, index)


class RunDirLock:
    """An exclusive flock on `<run dir>/.lock`, held until `release()` or process exit.

    The file keeps the holder's pid; a run that is refused afterwards puts the file's previous
    content back, so the lock leaves no trace of a refused run.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None
        self._before = b""

    def acquire(self) -> RunDirLock:
        """Take the lock or raise a RunDirError naming the process that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            refuse_links(self.path.parent)
            check_logs(self.path.parent)
            if os.path.lexists(self.path) and not self.path.is_file():
                what = "a directory" if self.path.is_dir() else "not a regular file (a FIFO?)"
                raise RunDirError(
                    f"{self.path} is {what}: it must be the run dir's lock file (a run writes "
                    f"its pid there). Remove it from {self.path.parent}, or pass a new "
                    "hydra.run.dir."
                )
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except SlimeHydraError as exc:
            raise RunDirError(str(exc)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_fd(fd).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise RunDirError(
                f"run dir {self.path.parent} is in use by another run (pid {holder}, which "
                f"holds {self.path}); two runs must not share a run dir. Wait for it to end, "
                "or pass a different hydra.run.dir."
            ) from None
        self._fd = fd
        self._before = _read_fd(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return self

    def release(self, refused: bool = False) -> None:
        """Drop the lock; when the run was refused, put the file's old content back first."""
        if self._fd is None:
            return
        if refused:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, self._before, 0)
        os.close(self._fd)
        self._fd = None


def make_run_dir(path: str | Path, key: str) -> None:
    """Create the dir `key` (hydra.run.dir or hydra.sweep.dir) names, or raise our error saying
    why it cannot be one: empty (the current dir: a typo such as an unset shell variable), a
    file, under a file, a name too long, no permission, a full disk."""
    if not str(path).strip():
        raise SlimeHydraError(
            f"{key} is empty, which would write the run's files into the current directory "
            f"({os.getcwd()}): pass {key}=DIR (an unset shell variable in the command?), or drop "
            "the override for the default under outputs/."
        )
    why = {
        errno.EEXIST: "it is a file, not a directory",
        errno.ENOTDIR: "a part of it is a file, not a directory",
        errno.ENAMETOOLONG: "the path (or one of its names) is too long for the file system",
        errno.EACCES: "this user may not create or write it",
        errno.EPERM: "this user may not create or write it",
        errno.EROFS: "it is on a read-only file system",
        errno.ENOSPC: "the disk is full",
    }
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "not writable")
    except OSError as exc:
        reason = why.get(exc.errno, exc.strerror or type(exc).__name__)
        if os.path.isfile(path):  # os.path: False, not an error, for a name too long
            reason = why[errno.EEXIST]
        raise SlimeHydraError(
            f"{key}={path} cannot be a run dir: {reason}. Pass a {key} that is (or can be "
            "created as) a writable directory."
        ) from None


LONGEST_FLOAT = "-2.2250738585072014e-308"
"""The longest text Python writes a float as (24 characters): an optuna trial's float value is
written into its dir name at most this long."""


def _longest_value(distribution: Any) -> str:
    """The longest value an optuna distribution gives a trial, as the sweeper writes it."""
    from optuna.distributions import (
        CategoricalDistribution,
        IntLogUniformDistribution,
        IntUniformDistribution,
    )

    if isinstance(distribution, CategoricalDistribution):
        return max((str(c) for c in distribution.choices), key=len)
    if isinstance(distribution, IntUniformDistribution | IntLogUniformDistribution):
        return max(str(distribution.low), str(distribution.high), key=len)
    return LONGEST_FLOAT


def _optuna_trial(config: DictConfig) -> tuple[list[str], int] | None:
    """The overrides of an optuna sweep's trial with every swept key at its longest value, and
    the last trial's number: the longest dir its trials can get; None where its search space is
    not all in the overrides (a custom or a deprecated search_space)."""
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

    sweeper = config.hydra.sweeper
    if sweeper.get("custom_search_space") or sweeper.get("search_space"):
        return None
    params = [f"{k!s}={v}" for k, v in (sweeper.get("params") or {}).items()]
    space, fixed = create_params_from_overrides([*params, *config.hydra.overrides.task])
    trial = {name: _longest_value(d) for name, d in space.items()} | fixed
    return [f"{name}={value}" for name, value in trial.items()], int(sweeper.n_trials) - 1


def sweep_job_subdirs(config: DictConfig) -> list[tuple[str, int, list[str], str]] | None:
    """(what to call it, job number, overrides, hydra.sweep.subdir) of each job of a basic
    sweep, named as Hydra's launchers name them (its job number and override_dirname); of an
    optuna sweep, one: the longest dir a trial can get; None for another sweeper, for sweep
    overrides or a subdir Hydra itself will report."""
    from hydra._internal.config_loader_impl import get_overrides_dirname
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import open_dict, read_write
    from omegaconf.errors import OmegaConfBaseException

    target = str(config.hydra.sweeper.get("_target_", ""))
    parser = OverridesParser.create()
    naming = config.hydra.job.config.override_dirname
    cfg = config.copy()
    out = []
    try:
        if target.endswith(".BasicSweeper"):
            params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
            overrides = parser.parse_overrides([*params, *config.hydra.overrides.task])
            (jobs,) = BasicSweeper.split_arguments(overrides, None)
            numbered = [(f"job {num} of this sweep", num, job) for num, job in enumerate(jobs)]
        elif target.endswith(".OptunaSweeper"):
            trial = _optuna_trial(config)
            if trial is None:
                return None
            longest = "of this sweep (each swept key at its longest value)"
            numbered = [(f"trial {trial[1]} {longest}", trial[1], trial[0])]
        else:
            return None
        raw = OmegaConf.to_container(config.hydra.sweep, resolve=False)["subdir"]
        if any(not k.startswith("hydra.job.") for k in re.findall(r"\$\{([^}]*)\}", str(raw))):
            # It reads the job's config: compose each job's as the launcher will (slower).
            loader = GlobalHydra.instance().config_loader()
            for name, num, job in numbered:
                job_cfg = loader.load_sweep_config(config, list(job))
                with open_dict(job_cfg):
                    job_cfg.hydra.job.num, job_cfg.hydra.job.id = num, f"job_id_for_{num}"
                out.append((name, num, job, str(job_cfg.hydra.sweep.subdir)))
            return out
        parsed = {o: parser.parse_override(o) for o in {o for *_, job in numbered for o in job}}
        exclude = list(naming.exclude_keys)
        with read_write(cfg.hydra), open_dict(cfg.hydra):
            for name, num, job in numbered:
                dirname = get_overrides_dirname(
                    [parsed[o] for o in job], exclude, naming.item_sep, naming.kv_sep
                )
                cfg.hydra.job.num, cfg.hydra.job.id = num, f"job_id_for_{num}"
                cfg.hydra.job.override_dirname = dirname
                out.append((name, num, job, str(cfg.hydra.sweep.subdir)))
    except (HydraException, OmegaConfBaseException, ValueError, AssertionError):
        return None
    return out


def check_job_dirs(config: DictConfig) -> None:
    """Every job of a basic sweep gets a dir of its own below the sweep dir, with names and a
    path the file system allows, and so does every trial of an optuna sweep (checked with its
    longest values). hydra.sweep.subdir names them: a long swept value, or a file where a job's
    dir goes, would make Hydra fail creating it with a traceback after the jobs before it ran,
    two jobs in one dir would refuse every job after the first, and '..' would put a job
    outside the sweep dir."""
    jobs = sweep_job_subdirs(config)
    sweep_dir = Path(config.hydra.sweep.dir).absolute()
    name_max = os.pathconf(sweep_dir, "PC_NAME_MAX")
    path_max = os.pathconf(sweep_dir, "PC_PATH_MAX")
    raw = OmegaConf.to_container(config.hydra.sweep, resolve=False)["subdir"]
    fix = "No job was run. Name the job dirs by number with hydra.sweep.subdir='${hydra.job.num}'"
    taken: dict[str, int] = {}
    for name, num, job, subdir in jobs or ():
        path = sweep_dir / subdir
        longest = max((len(os.fsencode(part)) for part in Path(subdir).parts), default=0)
        shown = str(path) if len(str(path)) <= 160 else f"{str(path)[:160]}…"
        if longest > name_max or len(os.fsencode(path)) >= path_max:
            limit = (
                f"a name of {longest} bytes where the file system allows {name_max}"
                if longest > name_max
                else f"a path of {len(os.fsencode(path))} bytes where it allows {path_max - 1}"
            )
            raise SlimeHydraError(
                f"{name} would run in {shown}, {limit}: "
                f"hydra.sweep.subdir={raw} names each job's dir after its overrides "
                f"({' '.join(job)[:60]}…). {fix}, or sweep shorter values."
            )
        where = os.path.normpath(path)
        if Path(where) != sweep_dir and sweep_dir not in Path(where).parents:
            raise SlimeHydraError(
                f"{name} would run in {where}, outside hydra.sweep.dir="
                f"{sweep_dir}: hydra.sweep.subdir={raw} must name a dir below it. {fix}."
            )
        blocked = file_in_the_way(Path(where))
        if blocked is not None:
            raise SlimeHydraError(
                f"{name} would run in {where}, but "
                f"{'that' if blocked == Path(where) else blocked} is a file, not a dir, so Hydra "
                "could not make the job's dir (it would stop the sweep with a traceback there). "
                "No job was run. Move the file away, or pass another hydra.sweep.dir."
            )
        if where in taken:
            raise SlimeHydraError(
                f"jobs {taken[where]} and {num} of this sweep would both run in {where}: "
                f"hydra.sweep.subdir={raw} gives them one dir, and a dir holds one run, so "
                f"every job after the first would be refused. {fix} (or put it in the subdir)."
            )
        taken[where] = num


def check_hydra_files(config: DictConfig, run_dir: Path) -> None:
    """Hydra writes only the job's log into the run dir, at a plain name: the app writes .hydra/
    itself once the run is accepted (hydra.output_subdir is null), and hydra.job.name names the
    log file <run dir>/<name>.log, so a name with "/" or ".." would put it elsewhere."""
    subdir = config.hydra.output_subdir
    if subdir is not None:
        raise SlimeHydraError(
            f"hydra.output_subdir={subdir!r}: Hydra would write its config snapshot there "
            "before the run is checked, so a refused run would change the run dir (or a dir "
            "outside it). slime_hydra writes the snapshot itself, as <run dir>/.hydra/, once "
            "the run is accepted: drop the override (conf/config.yaml sets it to null)."
        )
    name = str(config.hydra.job.name)
    existing = Path(run_dir).absolute()
    while not existing.exists():
        existing = existing.parent
    too_long = len(os.fsencode(f"{name}.log")) > os.pathconf(existing, "PC_NAME_MAX")
    if name in ("", ".", "..") or "/" in name or too_long:
        raise SlimeHydraError(
            f"hydra.job.name={name[:80]!r} names the job's log file (<run dir>/<name>.log) and "
            "must be a plain file name the file system allows, without '/' and not '..': this "
            "one would put the log outside the run dir or nowhere. Drop the override (the "
            "default is slime_hydra) or pass a short plain name."
        )


class RunDirPath(Callback):
    """Creates the run dir (or a sweep's dir) before Hydra does, so that a path that cannot be
    one is one paragraph and exit 1 instead of Hydra's traceback (registered in
    conf/config.yaml under hydra.callbacks); a sweep's job dirs and the files Hydra itself
    would write (check_hydra_files) are checked too."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Create hydra.run.dir or stop with our message."""
        self._refuse(check_hydra_files, config, Path(config.hydra.run.dir))
        self._refuse(make_run_dir, str(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Create hydra.sweep.dir and check its job dirs, or stop with our message."""
        self._refuse(check_hydra_files, config, Path(config.hydra.sweep.dir))
        self._refuse(make_run_dir, str(config.hydra.sweep.dir), "hydra.sweep.dir")
        # Hydra writes multirun.yaml and the jobs sweep_jobs.jsonl and their dirs: no link.
        self._refuse(refuse_links, Path(config.hydra.sweep.dir), "hydra.sweep.dir")
        self._refuse(check_sweep_jobs, Path(config.hydra.sweep.dir))
        self._refuse(check_job_dirs, config)

    @staticmethod
    def _refuse(check: Any, *args: Any) -> None:
        try:
            check(*args)
        except SlimeHydraError as exc:
            print(exc, file=sys.stderr, flush=True)
            sys.exit(1)


def check_sweep_jobs(sweep_dir: Path) -> None:
    """The sweep dir's SWEEP_JOBS, where each job notes its start and outcome, is a regular file
    or absent: one a job cannot append to would leave its jobs out of the sweep line."""
    path = Path(sweep_dir) / SWEEP_JOBS
    if os.path.lexists(path) and not path.is_file():
        raise SlimeHydraError(
            f"{path} is not a regular file: each job of a sweep appends its start and outcome "
            "there, for the line the sweep ends with. No job was run. Remove it, or pass "
            "another hydra.sweep.dir."
        )


SWEEP_START = {"sweep": "start"}
"""The SWEEP_JOBS line a sweep begins with: the jobs' lines after the last one are this sweep's."""


def note_sweep_start(sweep_dir: Path) -> None:
    """Mark in SWEEP_JOBS where this sweep's jobs begin (sweep.SweepSummary, before any job)."""
    with open_append(Path(sweep_dir) / SWEEP_JOBS, Path(sweep_dir)) as f:
        f.write(json.dumps(SWEEP_START) + "\n")


def note_sweep_job(
    sweep_dir: Path, job_dir: Path, failed: bool | None, num: int | None = None
) -> None:
    """Append this job's start (`failed` None, with its job number `num`) or outcome to the
    sweep dir's SWEEP_JOBS (one short O_APPEND write, so jobs running in parallel never
    interleave a line)."""
    entry: dict[str, Any] = {"job": os.path.relpath(job_dir, sweep_dir)}
    if failed is not None:
        entry["failed"] = failed
    if num is not None:
        entry["num"] = num
    with open_append(Path(sweep_dir) / SWEEP_JOBS, Path(sweep_dir)) as f:
        f.write(json.dumps(entry) + "\n")


def first_job_in(sweep_dir: Path, job_dir: Path) -> int | None:
    """The number of the first job of this sweep (after the last SWEEP_START) that started in
    `job_dir`, from SWEEP_JOBS; None where none did or the file cannot be read."""
    rel = os.path.relpath(job_dir, sweep_dir)
    try:
        with (Path(sweep_dir) / SWEEP_JOBS).open("rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except ValueError:
            continue  # a torn line: a job killed mid-write
    starts = [i for i, e in enumerate(entries) if e == SWEEP_START]
    for entry in entries[starts[-1] + 1 if starts else 0 :]:
        if isinstance(entry, dict) and entry.get("job") == rel and "failed" not in entry:
            num = entry.get("num")
            return num if isinstance(num, int) else None
    return None


def check_sweep_job_dir(sweep_dir: Path, job_dir: Path, num: int, subdir: Any) -> None:
    """Any sweeper's job, as it starts (after noting its start): its dir lies below the sweep
    dir and no earlier job of this sweep started in it. The basic sweeper's job dirs are
    checked before any job runs (check_job_dirs); another sweeper (optuna) picks its jobs as it
    goes, so each is checked by its own dir: `subdir` is hydra.sweep.subdir unresolved."""
    sweep = Path(sweep_dir).absolute()
    where = Path(os.path.normpath(Path(job_dir).absolute()))
    fix = "Name the job dirs by number with hydra.sweep.subdir='${hydra.job.num}'"
    if where == sweep or sweep not in where.parents:
        place = "the sweep dir itself" if where == sweep else "outside hydra.sweep.dir"
        raise RunDirError(
            f"job {num} of this sweep would run in {where}, {place} ({sweep}): "
            f"hydra.sweep.subdir={subdir} must name a dir below it, one per job. This job was "
            f"not run. {fix}."
        )
    first = first_job_in(sweep_dir, job_dir)
    if first is not None and first != num:
        raise RunDirError(
            f"jobs {first} and {num} of this sweep would both run in {where}: "
            f"hydra.sweep.subdir={subdir} gives them one dir, and a dir holds one run, so job "
            f"{num} was not run. {fix} (or put it in the subdir)."
        )


def holds_run(run_dir: Path) -> list[str]:
    """The run files present in `run_dir` (empty: the dir holds no run)."""
    return [name for name in RUN_FILES if (Path(run_dir) / name).exists()]


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key → leaf value of a nested config (lists are leaves)."""
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        if not node and prefix:
            out[prefix[:-1]] = {}
        return out
    return {prefix[:-1]: node}


def _matches(key: str, keys: tuple[str, ...]) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in keys)


@dataclass(frozen=True)
class ConfigDiff:
    """Keys whose values differ between the run dir's config and the new one: (key, old, new)."""

    refused: list[tuple[str, Any, Any]]
    applied: list[tuple[str, Any, Any]]
    free: list[tuple[str, Any, Any]]


def diff_configs(old: Mapping[str, Any], new: Mapping[str, Any]) -> ConfigDiff:
    """Sort every differing key into refused (schedule, model, data, ...), applied (optimizer)
    and free (length of the run, logging, and a key the saved config lacks whose new value is
    null/false: an option added since, off as it was)."""
    a, b = flatten(old), flatten(new)
    refused, applied, free = [], [], []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, ABSENT), b.get(key, ABSENT)
        if va == vb:
            continue
        entry = (key, va, vb)
        # A setting newer than the saved run, at its off value: it was off in that run too.
        added_off = va is ABSENT and vb in (None, False)
        if added_off or _matches(key, RESUME_FREE):
            free.append(entry)
        elif _matches(key, RESUME_APPLIED):
            applied.append(entry)
        else:
            refused.append(entry)
    return ConfigDiff(refused, applied, free)


def _changes(entries: list[tuple[str, Any, Any]]) -> str:
    return "; ".join(f"{key}: {old!r} → {new!r}" for key, old, new in entries)


def claim(run_dir: Path, config: Mapping[str, Any], resume: bool) -> list[tuple[str, Any, Any]]:
    """Refuse a run that may not use `run_dir`; return the optimizer keys a resume changes.

    A fresh run needs a dir that holds no run; a resume needs the dir's config.yaml and a new
    config that differs from it only in RESUME_FREE and RESUME_APPLIED keys.
    """
    run_dir = Path(run_dir)
    present = holds_run(run_dir)
    if not resume:
        if present:
            raise RunDirError(
                f"run dir {run_dir} already holds a run ({', '.join(present)}); a new run would "
                "overwrite it. Pass a new hydra.run.dir, add trainer.resume=true to continue "
                "that run (trainer=cpu|gpu, same config), or delete the dir."
            )
        return []
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise RunDirError(
            f"trainer.resume=true but run dir {run_dir} holds no run to resume (no config.yaml): "
            "pass the earlier run's hydra.run.dir, or drop trainer.resume."
        )
    fix = "restore the file or start a new run dir."
    try:
        text = read_text(saved, "the config of the run to resume,", fix)
    except SlimeHydraError as exc:
        raise RunDirError(str(exc)) from None
    try:
        old = yaml.load(text, Loader=NoAliasLoader)
    except (yaml.YAMLError, RecursionError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else "nested too deep"
        raise RunDirError(
            f"{saved} is not readable YAML ({first}), so this resume cannot be checked against "
            "the run it continues; " + fix
        ) from None
    if not isinstance(old, Mapping) or not old:
        what = "is empty" if old is None or old == {} else f"holds a {type(old).__name__}"
        raise RunDirError(
            f"{saved} {what}, not the config of a run, so this resume cannot be checked against "
            "the run it continues; " + fix
        )
    diff = diff_configs(old, config)
    if diff.refused:
        raise RunDirError(
            f"trainer.resume=true refused: the new config changes {len(diff.refused)} key(s) "
            f"that fix the schedule, data or model of the run in {run_dir} ({saved}): "
            f"{_changes(diff.refused)}. Resume with the old values (only trainer.lr, "
            "trainer.weight_decay, trainer.clip_grad, trainer.eps_clip(_high), step counts and "
            "logger.* may change), or start a new run with a new hydra.run.dir."
        )
    if diff.applied:
        log.warning("Resuming with changed optimizer settings: %s", _changes(diff.applied))
    return diff.applied


def write_run_files(run_dir: Path, cfg: DictConfig, schedule_json: dict, hydra: Any) -> list[Path]:
    """config.yaml, schedule.json and, when Hydra runs the job, `.hydra/` (config.yaml,
    hydra.yaml, overrides.yaml, as Hydra would have written them itself); returns them."""
    run_dir = Path(run_dir)
    files: dict[Path, str] = {
        run_dir / "config.yaml": OmegaConf.to_yaml(cfg, resolve=True),
        run_dir / "schedule.json": json.dumps(schedule_json),
    }
    if hydra is not None:
        out = run_dir / ".hydra"
        make_dirs(out, run_dir)
        overrides = OmegaConf.to_container(hydra.overrides.task)
        files[out / "config.yaml"] = OmegaConf.to_yaml(cfg)
        files[out / "hydra.yaml"] = OmegaConf.to_yaml({"hydra": hydra})
        files[out / "overrides.yaml"] = OmegaConf.to_yaml(overrides)
    try:
        write_files(files, run_dir)
    except BaseException:
        hydra_dir = run_dir / ".hydra"
        if hydra is not None and hydra_dir.is_dir() and not any(hydra_dir.iterdir()):
            hydra_dir.rmdir()  # absent, as the files it was made for
        raise
    stale = run_dir / ERROR_FILE
    if stale.is_file():  # a refused attempt's note; this run owns the dir now
        stale.unlink()
    return list(files)


def discard_run_files(run_dir: Path, written: list[Path]) -> None:
    """Remove what a fresh run wrote (`written`, and an empty metrics.jsonl) when it failed
    before its first step, so that the dir holds no run and a corrected rerun can take it."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.is_file() and not metrics.is_symlink() and metrics.stat().st_size == 0:
        metrics.unlink()
    for path in written:
        path.unlink(missing_ok=True)
    hydra = Path(run_dir) / ".hydra"
    if hydra.is_dir() and not hydra.is_symlink() and not any(hydra.iterdir()):
        hydra.rmdir()
