"""Run a worker script under torchrun (gloo, this machine) and read back what rank 0 saved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


def torchrun(script: Path, nproc: int, *args: str, timeout: float = 240) -> None:
    """`torchrun --standalone --nproc-per-node NPROC SCRIPT ARGS...` (one thread per rank);
    assert it exits 0."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "-W",
        "ignore",
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(script),
        *args,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]


def run_torchrun(script: Path, nproc: int, out: Path, *args: str, timeout: float = 240) -> Any:
    """`torchrun ... SCRIPT OUT ARGS...`; torch.load(OUT), what rank 0 saved."""
    torchrun(script, nproc, str(out), *args, timeout=timeout)
    return torch.load(out)
