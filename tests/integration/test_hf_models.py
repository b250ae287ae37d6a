"""Real models: tiny HF Qwen2 checkpoints (made here, no hub) load into our GPTModel chunks on
every layout with transformers' logits, train, and export back to checkpoints transformers
loads; text rollouts train end to end from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.hf_models import hf_logits, make_checkpoint, write_text_rollouts
from tests.integration._hf_worker import SEQUENCES
from tests.integration.torchrun import REPO

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("_hf_worker.py")
ATOL = 1e-4


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tied and untied 2-layer checkpoints, and a 4-layer one for pp=2 × vpp=2."""
    root = tmp_path_factory.mktemp("hf")
    return {
        "tied": make_checkpoint(root / "tied", tied=True, seed=0),
        "untied": make_checkpoint(root / "untied", tied=False, seed=1),
        "layers4": make_checkpoint(root / "layers4", tied=True, num_layers=4, seed=2),
    }


def run_worker(out: Path, nproc: int, layout: str, *args: object) -> None:
    """`torchrun _hf_worker.py OUT TP PP VPP CP ARGS...` on nproc gloo ranks."""
    out.mkdir(parents=True)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc-per-node={nproc}", str(WORKER), str(out), *layout.split()]
    proc = subprocess.run(
        [*cmd, *map(str, args)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]


def assert_same_weights(source: Path, export: Path) -> None:
    """Every tensor bit-identical, in the same dtype, and nothing more or less."""
    want, got = load_file(source / "model.safetensors"), load_file(export / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


def assert_logits_match(ckpt: Path, logits: torch.Tensor) -> None:
    ref = torch.cat(hf_logits(ckpt, SEQUENCES))
    assert logits.shape == ref.shape
    diff = (logits - ref).abs().max().item()
    assert diff < ATOL, f"max |megatron - transformers| = {diff:.2e}"


@pytest.mark.parametrize(
    ("layout", "nproc", "order"),
    [
        # tp=1 in one process: tied then untied then tied again (a class-level mapping changed
        # by the tied model must not leak into the untied one). tp=2 loads in the train test.
        ("1 1 1 1", 1, ["tied", "untied", "tied"]),
        ("1 2 1 1", 2, ["tied", "untied"]),
        ("1 2 2 1", 2, ["layers4"]),
    ],
    ids=["tp1", "pp2", "pp2_vpp2"],
)
def test_weights_load_with_transformers_logits_and_export_bit_identical(
    tmp_path, ckpts, layout, nproc, order
):
    run_worker(tmp_path / "w", nproc, layout, "load", *(ckpts[name] for name in order))
    for i, name in enumerate(order):
        assert_logits_match(ckpts[name], torch.load(tmp_path / "w" / f"logits_{i}.pt"))
        assert_same_weights(ckpts[name], tmp_path / "w" / f"export_{i}")


def test_trained_export_reloads_in_transformers_with_megatrons_logits(tmp_path, ckpts):
    """The engine at tp=2 loads transformers' logits, trains two steps on text rollouts,
    exports, and transformers reloads the export with the trained model's logits."""
    rollouts = write_text_rollouts(tmp_path / "rollouts.jsonl")
    run_worker(tmp_path / "w", 2, "2 1 1 1", "train", ckpts["untied"], rollouts)
    assert_logits_match(ckpts["untied"], torch.load(tmp_path / "w" / "logits_loaded.pt"))
    result = torch.load(tmp_path / "w" / "train.pt", weights_only=False)
    assert [s.skipped for s in result["steps"]] == [False, False]
    export = tmp_path / "w" / "export_0"
    trained = load_file(export / "model.safetensors")
    source = load_file(ckpts["untied"] / "model.safetensors")
    assert not torch.equal(trained["lm_head.weight"], source["lm_head.weight"])  # it trained
    assert_logits_match(export, torch.load(tmp_path / "w" / "logits_0.pt"))
    assert (export / "tokenizer.json").is_file() and (export / "config.json").is_file()


def cli(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-W", "ignore", "-m", "slime_hydra", f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    return subprocess.run(
        [*cmd, *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )


def test_text_rollouts_train_end_to_end_and_lr0_exports_the_input(tmp_path, ckpts):
    """model=hf + data=text from the command line on cp=2: two steps, metrics, and with lr=0
    an export whose weights are the input's, bit for bit, loadable with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rollouts = write_text_rollouts(tmp_path / "rollouts.jsonl")
    run_dir = tmp_path / "run"
    proc = cli(
        run_dir,
        "model=hf",
        f"model.path={ckpts['tied']}",
        "data=text",
        f"data.path={rollouts}",
        "logger=jsonl",
        "parallel.cp=2",
        "batching.global_batch_size=4",
        "batching.max_tokens_per_gpu=96",
        "trainer.lr=0",
        "trainer.export_hf=true",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/grad_norm"] > 0 for r in rows)
    export = run_dir / "hf"
    assert_same_weights(ckpts["tied"], export)
    AutoModelForCausalLM.from_pretrained(str(export))
    tokenizer = AutoTokenizer.from_pretrained(str(export))
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template


def test_a_bad_checkpoint_is_one_error_before_any_worker(tmp_path, ckpts):
    """config.json without weights: one paragraph, exit 1, no traceback, nothing written."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((ckpts["tied"] / "config.json").read_text())
    run_dir = tmp_path / "run"
    proc = cli(run_dir, "model=hf", f"model.path={broken}", "logger=jsonl")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "no *.safetensors weights" in out and "Traceback" not in out
    assert not any((run_dir / name).exists() for name in ("schedule.json", "metrics.jsonl"))
