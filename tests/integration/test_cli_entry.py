"""The command line as users meet it: the `slime-hydra` script, --help, completion, the run's
log file, and debug=default."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.integration.cli import REPO, run_cli

pytestmark = pytest.mark.integration

SCRIPT = shutil.which("slime-hydra", path=str(Path(sys.executable).parent))
needs_script = pytest.mark.skipif(
    SCRIPT is None, reason="slime-hydra is not installed (pip install -e .)"
)


@needs_script
def test_the_console_script_runs_from_any_directory(tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [SCRIPT, "debug=default", "trainer=plan", "logger=jsonl", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env={**os.environ, "WANDB_MODE": "offline"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    # debug=default: one step of 8 samples.
    rows = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [1]
    assert len(json.loads((run_dir / "schedule.json").read_text())["lengths"]) == 8
    # One log file, named after the app, not after the module Hydra was started from.
    assert (run_dir / "slime_hydra.log").is_file()
    assert not (run_dir / "__main__.log").exists()


def test_help_lists_every_group_option_and_no_schema_node():
    out = run_cli("--help")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "base_" not in text
    groups = [p for p in (REPO / "conf").iterdir() if p.is_dir() and p.name != "hydra"]
    for group in groups:
        for option in group.glob("*.yaml"):
            assert option.stem in text, f"--help does not name {group.name}={option.stem}"
    for key in ("batching.max_tokens_per_gpu", "parallel.dp", "logger.name", "hydra.run.dir"):
        assert key in text


def test_help_and_the_app_import_neither_torch_nor_megatron():
    # --help composes the config through the app's imports; torch alone takes seconds.
    probe = (
        "import sys, slime_hydra.__main__; print(sorted({'torch', 'megatron'} & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_plan_run_imports_neither_torch_nor_megatron(tmp_path):
    # Plan mode builds the iterator group's object (data/iterator.py); THD packing, which
    # imports torch and megatron (5 s of a 6 s plan run), loads only when a rank packs.
    run_dir = tmp_path / "run"
    probe = (
        "import atexit, sys, runpy\n"
        "atexit.register(lambda: print(sorted({'torch', 'megatron'} & set(sys.modules))))\n"
        f"sys.argv = ['slime_hydra', 'trainer=plan', 'logger=jsonl', 'hydra.run.dir={run_dir}']\n"
        "runpy.run_module('slime_hydra', run_name='__main__')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert (run_dir / "schedule.json").is_file()
    assert out.stdout.strip().splitlines()[-1] == "[]"


def complete(line: str) -> list[str]:
    """What bash completion of the `slime-hydra` script offers for `line`."""
    env = {**os.environ, "COMP_LINE": line, "COMP_POINT": str(len(line))}
    out = subprocess.run(
        [SCRIPT, "-sc", "query=bash"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@needs_script
def test_bash_completion_offers_the_options_and_no_schema_node():
    assert complete("slime-hydra batching=sl") == ["batching=slime_1823", "batching=slime_1848"]
    # The schemas the options extend are not options.
    assert complete("slime-hydra batching=") == [
        *("batching=dynamic", "batching=fixed", "batching=slime_1823", "batching=slime_1848")
    ]
    assert complete("slime-hydra logger=") == ["logger=console", "logger=jsonl", "logger=wandb"]


def test_a_wheel_install_carries_the_configs_and_runs(tmp_path):
    """Built and installed apart from the checkout, the package still composes its configs
    (they ship inside it) and runs a plan from a directory that has no conf/."""
    src, wheels, site = tmp_path / "src", tmp_path / "wheels", tmp_path / "site"
    # A copy of the sources: setuptools builds in the source tree, which stays untouched.
    for name in ("slime_hydra", "conf"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, src], check=True
    )
    (wheel,) = wheels.glob("slime_hydra-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", site, wheel], check=True)
    run_dir = tmp_path / "run"
    overrides = ["debug=default", "trainer=plan", "logger=jsonl", f"hydra.run.dir={run_dir}"]
    out = subprocess.run(
        [sys.executable, "-m", "slime_hydra", *overrides],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(site), "WANDB_MODE": "offline"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert (run_dir / "metrics.jsonl").is_file()
    # The run composed the installed copy's configs, not the checkout's.
    sources = OmegaConf.load(run_dir / ".hydra/hydra.yaml").hydra.runtime.config_sources
    assert str(site / "slime_hydra/conf") in [s.path for s in sources]
