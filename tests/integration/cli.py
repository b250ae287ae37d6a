"""Run `python -m slime_hydra` as a user would, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(
    *overrides: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m slime_hydra OVERRIDES...` from the repo root, offline, output captured;
    `env` adds to (or replaces) this process's environment."""
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "slime_hydra", *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
