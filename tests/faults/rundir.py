"""Checksums of a run dir, to assert that a refused run lost or changed nothing in it."""

from __future__ import annotations

import hashlib
from pathlib import Path

# A refused run may add only these: the lock file (its old content put back, so empty in a
# new dir) and Hydra's job log, which only grows (the refusal is logged there).
MAY_APPEAR = (".lock",)


def snapshot(root: Path) -> dict[str, bytes]:
    """Relative path → content of every file under `root` (logs kept whole for a prefix check)."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def digest(files: dict[str, bytes]) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}


def assert_untouched(before: dict[str, bytes], root: Path, ignore: tuple[str, ...] = ()) -> None:
    """Every file is as it was (a log may only have grown); nothing new but the lock or a log;
    `ignore` names files that are no run's (Hydra's multirun.yaml of a sweep dir)."""
    after = {k: v for k, v in snapshot(root).items() if k not in ignore}
    before = {k: v for k, v in before.items() if k not in ignore}
    lost = sorted(set(before) - set(after))
    assert not lost, f"lost: {lost}"
    for name, content in before.items():
        if name.endswith(".log"):
            assert after[name].startswith(content), f"{name} was rewritten"
        else:
            assert hashlib.sha256(after[name]).digest() == hashlib.sha256(content).digest(), (
                f"{name} changed"
            )
    new = sorted(n for n in set(after) - set(before) if not n.endswith(".log"))
    assert all(n in MAY_APPEAR and not after[n].strip() for n in new), f"new files: {new}"
