"""launch/*.sh and slurm.sbatch in DRY_RUN mode: the torchrun command each would run, checked
anywhere (no SLURM, no GPUs)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def dry_run(script: str, *args: str, **env: str) -> str:
    """The script's DRY_RUN output; it must exit 0."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(
        ["bash", str(REPO / script), *args],
        cwd=REPO,
        env={**clean, "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_slurm_dry_run_works_outside_slurm() -> None:
    out = dry_run("launch/slurm.sbatch", "trainer=gpu", "parallel.dp=2")
    srun, node0 = out.strip().splitlines()
    assert srun.startswith("srun --kill-on-bad-exit=1 launch/multinode.sh trainer=gpu")
    assert "--nnodes 2 --node-rank 0 --nproc-per-node 8" in node0
    assert node0.endswith("hydra.run.dir=outputs/runs/slurm-dryrun trainer=gpu parallel.dp=2")


def test_slurm_dry_run_reads_the_allocation() -> None:
    out = dry_run(
        "launch/slurm.sbatch",
        "trainer=gpu",
        SLURM_NNODES="4",
        SLURM_JOB_ID="77",
        SLURM_JOB_NODELIST="gpu-a,gpu-b",
    )
    node0 = out.strip().splitlines()[1]
    assert "--nnodes 4" in node0 and "slurm-77" in node0
    assert "--rdzv-endpoint gpu-a:29500" in node0
