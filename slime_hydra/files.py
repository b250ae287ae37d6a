"""The one way files are written into a run dir and read from a user: no symlink followed, a set
of files complete or absent, a full disk named as such, and bytes that are not UTF-8 text, JSON
nested past reason or a number in other digits refused as one paragraph instead of a traceback.

Writing: `write_files` stages every file of a set under a fresh temporary name (created with
O_EXCL | O_NOFOLLOW, so a planted `.x.tmp` symlink is never written through), then renames them
into place; a failure removes every temporary file. `write_dir` does the same for a whole dir
(an HF export): filled in a fresh dir beside it, then renamed into place. `check_inside` refuses
a path whose dirs below the run dir are symlinks (a rename into a symlinked dir would land
outside the run dir).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, ClassVar

from slime_hydra.errors import SlimeHydraError

Content = bytes | str | Callable[[IO[bytes]], None]
"""What `write_files` writes: bytes, text (UTF-8) or a function writing to a binary file."""

MAX_JSON_DEPTH = 200
"""Deepest nesting a JSON record may have; real rollouts and metrics nest a few levels."""

_DIGITS = re.compile(r"[0-9]+")


def _is_link(path: Path) -> bool:
    return os.path.islink(path)


def check_inside(path: Path, root: Path, key: str = "hydra.run.dir") -> None:
    """Refuse `path` when it or a dir between `root` and it is a symlink: a file created there
    would be written wherever the link points, outside the run dir (`key`: the setting that
    names `root`)."""
    path, root = Path(path), Path(root)
    rel = path.relative_to(root)
    at = root
    for part in rel.parts:
        at = at / part
        if _is_link(at):
            raise SlimeHydraError(
                f"{at} is a symlink (to {os.readlink(at)}); the run dir's files are never written "
                f"through links, so nothing was written. Remove the link from {root}, or pass a "
                f"new {key}."
            )


FOREIGN_DIRS = ("wandb",)
"""Dirs of a run dir that another library fills: wandb links its `latest-run`, `debug.log` and
saved files to its own offline runs there, and a rerun or resume must accept them. The dir
itself may not be a link; what we write inside (`wandb/run_id`) goes through `check_inside`."""


def refuse_links(root: Path, key: str = "hydra.run.dir") -> None:
    """Refuse a run (or sweep) dir holding a symlink anywhere outside FOREIGN_DIRS: a link
    planted there (as `.lock`, `config.yaml`, `checkpoints`, a sweep's `multirun.yaml`) would
    redirect a write outside the dir."""
    for where, dirs, names in os.walk(root):
        for name in sorted(dirs + names):
            if _is_link(Path(where) / name):
                check_inside(Path(where) / name, Path(root), key)
        dirs[:] = [name for name in dirs if name not in FOREIGN_DIRS]


def file_in_the_way(path: Path) -> Path | None:
    """What `mkdir -p path` would fail on: the deepest entry that exists on `path` (itself or
    a parent) where it is not a dir; None where there is none."""
    here = next((at for at in (Path(path), *Path(path).parents) if os.path.lexists(at)), None)
    return here if here is not None and not here.is_dir() else None


def make_dirs(path: Path, root: Path, key: str = "hydra.run.dir") -> None:
    """mkdir -p `path` below `root`, refusing a symlink on the way (`key`: the setting that
    names the dir, for the message)."""
    check_inside(path, root, key)
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        at = file_in_the_way(path)
        if at is None:  # gone again: a race, not ours to explain
            raise
        where = "" if at == Path(path) else f" ({path})"
        raise SlimeHydraError(
            f"{at} is a file where a dir is needed{where}: move the file away, or pass a new {key}."
        ) from None
    check_inside(path, root, key)


def disk_full(path: Path, needed: int | None) -> SlimeHydraError:
    """The error for a write that ran out of space: where, how much, what to do."""
    size = f" ({needed} bytes needed)" if needed is not None else ""
    return SlimeHydraError(
        f"no space left on the device of {path}{size}: nothing of this write was kept (its "
        "temporary files are removed). Free space there, or pass a hydra.run.dir on another disk."
    )


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps: torch.save turns an OSError into a RuntimeError) is a
    full disk or quota."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return "No space left on device" in str(exc)


_STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the block: a stop raised by their handler lands after it, never
    between creating a temporary file and recording it for removal."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _temp_for(path: Path, staged: list[tuple[Path, Path]]) -> int:
    """A new temporary file beside `path`, created exclusively (never an existing name or link)
    and recorded in `staged` with no stop in between; returns its descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with _stops_held():
        fd = os.open(tmp, flags, 0o644)
        staged.append((tmp, path))
    return fd


def _write_one(fd: int, content: Content) -> int:
    """Write `content` to the open file; return the bytes written."""
    with os.fdopen(fd, "wb") as f:
        if callable(content):
            content(f)
        else:
            f.write(content.encode() if isinstance(content, str) else content)
        f.flush()
        os.fsync(f.fileno())
        return f.tell()


def write_files(files: Mapping[Path, Content], root: Path) -> None:
    """Write every file of `files` (all below `root`) or none: each is staged under a temporary
    name first, then all are renamed into place; on a failure the temporary files are removed
    and a full disk becomes our error with the path and the bytes needed."""
    for path in files:  # before any is written: a rename onto a dir would fail half-way
        if os.path.isdir(path) and not os.path.islink(path):
            raise SlimeHydraError(
                f"{path} is a directory, and the run writes its file there: remove it, or pass a "
                "new hydra.run.dir."
            )
    staged: list[tuple[Path, Path]] = []
    try:
        for path, content in files.items():
            check_inside(Path(path).parent, root)
            fd = _temp_for(Path(path), staged)
            try:
                _write_one(fd, content)
            except BaseException as exc:
                if is_disk_full(exc):
                    needed = None if callable(content) else len(content)
                    raise disk_full(Path(path), needed) from None
                raise
        for tmp, path in staged:
            os.replace(tmp, path)  # replaces a planted link itself, never its target
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full(staged[-1][1] if staged else Path(root), None) from None
        raise
    finally:
        with _stops_held():
            for tmp, _ in staged:
                if os.path.lexists(tmp):
                    os.unlink(tmp)


def write_file(path: Path, content: Content, root: Path) -> None:
    """`write_files` of one file."""
    write_files({Path(path): content}, root)


def write_dir(path: Path, fill: Callable[[Path], None], root: Path) -> None:
    """Create the dir `path` (below `root`) whole or not at all: `fill` writes its files into a
    fresh private dir beside it (made by mkdir, so never a planted link), whose files are then
    fsync'd and which replaces `path` by rename, an old `path` removed after. On a failure the
    fresh dir is removed and `path` stays as it was; a full disk is our error naming `path`."""
    path = Path(path)
    check_inside(path, root)
    stage = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    old = stage.with_suffix(".old")
    made = False
    try:
        with _stops_held():
            stage.mkdir(mode=0o700)
            made = True
        fill(stage)
        for file in stage.rglob("*"):
            if file.is_file() and not file.is_symlink():
                _fsync(file)
        check_inside(path, root)
        replaced = os.path.lexists(path)
        if replaced:
            os.rename(path, old)
        try:
            os.rename(stage, path)
        except BaseException:
            if replaced:
                os.rename(old, path)
            raise
    except BaseException as exc:
        if is_disk_full(exc):
            raise disk_full(path, None) from None
        raise
    finally:
        with _stops_held():
            for leftover in (stage, old) if made else ():
                if os.path.lexists(leftover):
                    shutil.rmtree(leftover)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_append(path: Path, root: Path) -> IO[str]:
    """`path` opened for appending text, created if absent, never through a symlink."""
    check_inside(Path(path), root)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o644), "a", encoding="utf-8")


def append_whole(f: IO[str], text: str, path: Path) -> None:
    """Append `text` to `f` (from open_append, never written through its buffer) whole or not
    at all: a write the disk cuts short is taken back (the file truncated to its size before),
    so no torn line is left, and a full disk is our error naming `path` and the bytes needed."""
    data = text.encode()
    fd = f.fileno()
    size = os.fstat(fd).st_size
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        os.ftruncate(fd, size)
        if is_disk_full(exc):
            raise disk_full(Path(path), len(data)) from None
        raise


def stdout_full(exc: BaseException) -> bool:
    """Whether `exc` is a full disk under stdout (output redirected to a file). If so, say so
    once on stderr and send the rest of stdout to /dev/null, so that neither the next print or
    log line nor the flush at exit fails again: the console is a view, the run goes on."""
    if not is_disk_full(exc):
        return False
    try:
        where = os.readlink("/proc/self/fd/1")
    except OSError:
        where = "stdout"
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stderr.write(
        f"no space left on the device of {where} (stdout): the console output stops here, the "
        "run goes on (metrics.jsonl and the log file are written as before). Free space there.\n"
    )
    return True


class ConsoleHandler(logging.StreamHandler):
    """The job's console log (Hydra's `console` handler, conf/config.yaml): on stdout redirected
    to a full disk it says so once (stdout_full) instead of a traceback per record."""

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if exc is None or not stdout_full(exc):
            super().handleError(record)


class NoFollowFileHandler(logging.FileHandler):
    """A logging.FileHandler that never appends through a symlink (Hydra's job log, a rank's
    log): a planted link gets no log, and the run refuses the dir (refuse_links). On a full disk
    it says so once, in one line on stderr, and logs no more to the file (logging's default is a
    traceback per record)."""

    full: bool = False
    unopened: ClassVar[dict[str, str]] = {}
    """Log files that could not be opened (a dir or another non-file planted in their place):
    path → why. Their records go nowhere, and the run refuses the dir (check_logs)."""

    def emit(self, record: logging.LogRecord) -> None:
        if not self.full:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if exc is None or not is_disk_full(exc):
            super().handleError(record)
            return
        self.full = True
        if self.stream is not None:
            with contextlib.suppress(OSError):  # closing flushes what the disk refused: fails
                self.stream.close()
            self.stream = None
        sys.stderr.write(
            f"no space left on the device of {self.baseFilename}: this log stops here; the "
            "run's messages still go to the console. Free space there, or pass a hydra.run.dir "
            "on another disk.\n"
        )

    def _open(self) -> IO[str]:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.baseFilename, flags, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # a link: refuse_links names it
                NoFollowFileHandler.unopened[self.baseFilename] = exc.strerror or str(exc)
            fd = os.open(os.devnull, os.O_WRONLY)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def check_logs(root: Path, key: str = "hydra.run.dir") -> None:
    """Refuse a run dir whose log file could not be opened (NoFollowFileHandler.unopened): a dir
    or another non-file planted at its name would leave the run without its log."""
    for path, why in NoFollowFileHandler.unopened.items():
        if Path(path).parent == Path(root):
            raise SlimeHydraError(
                f"{path} cannot be opened as the run's log file ({why}): the run writes its "
                f"messages there. Remove what is at that name, or pass a new {key}."
            )


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def read_bytes(path: Path, what: str, fix: str) -> bytes:
    """The bytes of the regular file `path`, or our error naming `what` it is, the problem and
    `fix`: missing, a directory, a FIFO or device (whose read would block or never end), or
    larger than the memory available (the read would be killed for memory, without a word)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SlimeHydraError(f"{what} {path} does not exist; {fix}") from None
    except OSError as exc:
        raise SlimeHydraError(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise SlimeHydraError(f"{what} {path} is a directory, not a file; {fix}")
        if not stat.S_ISREG(info.st_mode):
            raise SlimeHydraError(
                f"{what} {path} is not a regular file (a FIFO, device or socket, whose read "
                f"would block or never end); {fix}"
            )
        available = available_memory()
        if available is not None and info.st_size > available:
            raise SlimeHydraError(
                f"{what} {path} holds {info.st_size:,} bytes, more than the {available:,} bytes "
                f"of memory available here: reading it would be killed for memory. {fix}"
            )
        try:
            return f.read()
        except OSError as exc:
            raise SlimeHydraError(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None


def read_text(path: Path, what: str, fix: str) -> str:
    """The UTF-8 text of `path` (`read_bytes`), or our error naming `what` it is, the problem
    and `fix`."""
    path = Path(path)
    data = read_bytes(path, what, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        kind = " (it is gzip-compressed: decompress it first)" if data[:2] == b"\x1f\x8b" else ""
        raise SlimeHydraError(
            f"{what} {path} is not UTF-8 text{kind}: byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}; {fix}"
        ) from None


def _depth(value: Any) -> int:
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [
            v
            for item in level
            if isinstance(item, dict | list)
            for v in (item.values() if isinstance(item, dict) else item)
        ]
        if depth > MAX_JSON_DEPTH:
            break
    return depth


class _DuplicateKey(ValueError):
    """A JSON object names one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object_pairs_hook: the object as a dict, refusing a key named twice."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def parse_json(text: str, at: str) -> Any:
    """One JSON value from `text`; our error naming `at` for invalid or too deeply nested JSON,
    or an object that names a key twice (json.loads would keep the last one silently)."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise SlimeHydraError(f"{at}: not valid JSON ({exc.msg}).") from None
    except _DuplicateKey as exc:
        raise SlimeHydraError(
            f"{at}: an object names the key {exc.args[0]!r} twice, and which value it means is "
            "not defined (a JSON reader keeps one silently). Write each key once."
        ) from None
    except RecursionError:
        value = None
        too_deep = True
    else:
        too_deep = _depth(value) > MAX_JSON_DEPTH
    if too_deep:
        raise SlimeHydraError(
            f"{at}: JSON nested deeper than {MAX_JSON_DEPTH} levels; no record nests that deep, "
            "so the file is damaged or not this kind of file."
        )
    return value


def json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """(`file:line`, value) of each non-blank line of a JSON Lines file; a line that is not
    UTF-8, not JSON or nested too deep is our error naming file and line."""
    path = Path(path)
    data = read_bytes(path, "data.path", "point data.path at a JSON Lines file.")
    gzip = " (it is gzip-compressed: decompress it first)" if data[:2] == b"\x1f\x8b" else ""
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        at = f"{path}:{lineno}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SlimeHydraError(
                f"{at}: not UTF-8 text{gzip} (byte 0x{raw[exc.start]:02x} at column "
                f"{exc.start + 1}); write the file as UTF-8 JSON Lines."
            ) from None
        if line.strip():
            yield at, parse_json(line, at)


def parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(`file row r`, record) of each row of a Parquet file, read as read_bytes reads (no FIFO,
    dir or file larger than memory); a file pyarrow cannot read is our error naming it, with
    pyarrow's reason on one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq  # only the Parquet sources need pyarrow

    path = Path(path)
    data = read_bytes(path, "data.path", "point data.path at a Parquet file.")
    try:
        rows = pq.read_table(pa.BufferReader(data)).to_pylist()
    except Exception as exc:  # pyarrow raises several types for a file it cannot read
        reason = " ".join(str(exc).split())[:300]
        raise SlimeHydraError(f"{path}: not a readable Parquet file ({reason}).") from None
    return ((f"{path} row {r}", row) for r, row in enumerate(rows))


def parse_count(text: str) -> int | None:
    """A non-negative integer written in ASCII digits only, or None: "٣", " 3", "+3", "3.0" and
    "1_000" are not counts (int() would read several of them)."""
    return int(text) if _DIGITS.fullmatch(text) else None
