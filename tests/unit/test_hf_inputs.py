"""model=hf and data=text without processes: dims from config.json (trainer, FLOPs model and
plan mode alike), text rollouts tokenized with the checkpoint's tokenizer, and every bad input
refused with one SlimeHydraError before a worker would start."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from slime_hydra import app
from slime_hydra.config import build
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.text import TextRollouts
from slime_hydra.data.tokens import RolloutTokens, grpo_advantages
from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checkpoint import HfCheckpoint
from slime_hydra.hf.checks import model_dims
from slime_hydra.log.sink import RunInfo
from slime_hydra.schedule.cost import ModelDims, flops_coefficients
from slime_hydra.train.run import start
from tests.hf_models import VOCAB, edit_config, make_checkpoint, write_text_rollouts


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("hf") / "qwen", tied=True)


@pytest.fixture
def ckpt(source: Path, tmp_path: Path) -> Path:
    """A fresh copy of the checkpoint each test may break."""
    return Path(shutil.copytree(source, tmp_path / "ckpt"))


@pytest.fixture
def job_of(compose_cfg, tmp_path):
    """job_of(*overrides) -> (trainer, Job), planned as the app plans before any launch."""

    def _job(*overrides: str):
        cfg = compose_cfg(*overrides)
        run = RunInfo(tmp_path / "run", OmegaConf.to_container(cfg), "test", None, "cpu")
        return build(cfg.trainer), app.plan(cfg, run)

    return _job


def text_overrides(ckpt: Path, tmp_path: Path) -> list[str]:
    rollouts = write_text_rollouts(tmp_path / "rollouts.jsonl")
    return [
        "model=hf",
        f"model.path={ckpt}",
        "data=text",
        f"data.path={rollouts}",
        "batching.global_batch_size=4",
    ]


def test_dims_come_from_config_json(ckpt):
    dims = model_dims({"name": "hf", "path": str(ckpt)})
    assert (dims.num_layers, dims.hidden_size, dims.ffn_hidden_size) == (2, 64, 128)
    assert (dims.num_attention_heads, dims.num_query_groups, dims.vocab_size) == (4, 2, VOCAB)
    assert dims.rotary_base == 10000.0 and dims.add_qkv_bias and dims.swiglu
    assert not dims.untie_embeddings_and_output_weights and dims.path == str(ckpt)


def test_transformers_4_configs_keep_rope_theta_at_the_top(ckpt):
    edit_config(ckpt, rope_parameters=None, rope_theta=1e6)
    assert HfCheckpoint.open(ckpt).dims()["rotary_base"] == 1e6


def test_plan_mode_and_the_flops_model_use_the_checkpoints_dims(job_of, ckpt):
    trainer, job = job_of("model=hf", f"model.path={ckpt}", "trainer=plan")
    dims = ModelDims.from_mapping(HfCheckpoint.open(ckpt).dims())
    assert job.flops_coefficients == flops_coefficients(dims)
    start.check(trainer, job)


def test_a_sound_hf_text_job_passes_the_checks(job_of, ckpt, tmp_path):
    trainer, job = job_of(*text_overrides(ckpt, tmp_path))
    start.check(trainer, job)


def test_text_rollouts_use_the_chat_template_and_mask_the_response(ckpt, tmp_path):
    from transformers import AutoTokenizer

    rollouts = write_text_rollouts(tmp_path / "r.jsonl", num_prompts=2, per_prompt=4)
    batch = TextRollouts(str(rollouts), tokenizer=str(ckpt)).load()
    tokens: RolloutTokens = batch.tokens
    tok = AutoTokenizer.from_pretrained(str(ckpt))
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    for i, record in enumerate(records):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": record["prompt"]}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        response = [
            *tok(record["response"], add_special_tokens=False)["input_ids"],
            tok.eos_token_id,
        ]
        sample = tokens.sample(i)
        assert sample["tokens"].tolist() == prompt + response
        assert tok.decode(prompt).endswith("<|im_start|>assistant\n")
        assert int(batch.response_lengths[i]) == len(response) and sample["loss_mask"].all()
    assert batch.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    rewards = np.array([r["reward"] for r in records], dtype=np.float32)
    want = np.repeat(grpo_advantages(rewards, batch.group_ids), batch.response_lengths)
    np.testing.assert_allclose(tokens.advantages, want)


def test_text_records_with_a_bad_reward_name_the_line(ckpt, tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"prompt": "hi", "response": "yo", "reward": "good"}) + "\n")
    with pytest.raises(SlimeHydraError, match=r"r\.jsonl:1: reward='good' is not a number"):
        TextRollouts(str(path), tokenizer=str(ckpt)).load()


def test_text_data_without_a_tokenizer_names_model_path(tmp_path):
    path = write_text_rollouts(tmp_path / "r.jsonl")
    with pytest.raises(SlimeHydraError, match=r"model\.path=DIR"):
        TextRollouts(str(path), tokenizer=None).load()


def check(job_of, *overrides: str) -> str:
    """The one error that planning and the trainer's checks raise for `overrides`."""
    with pytest.raises(SlimeHydraError) as err:
        trainer, job = job_of(*overrides)
        start.check(trainer, job)
    return str(err.value)


def test_missing_config_json(job_of, ckpt):
    (ckpt / "config.json").unlink()
    assert "has no config.json" in check(job_of, "model=hf", f"model.path={ckpt}")


def test_missing_model_path_names_the_override(job_of):
    assert "model.path=" in check(job_of, "model=hf")


def test_missing_weights(job_of, ckpt):
    (ckpt / "model.safetensors").unlink()
    assert "no *.safetensors weights" in check(job_of, "model=hf", f"model.path={ckpt}")


def test_unsupported_architecture_is_refused_by_name(job_of, ckpt):
    edit_config(ckpt, architectures=["LlamaForCausalLM"], model_type="llama")
    msg = check(job_of, "model=hf", f"model.path={ckpt}")
    assert "LlamaForCausalLM" in msg and "Qwen2" in msg


def test_shapes_that_disagree_with_config_json(job_of, ckpt):
    edit_config(ckpt, intermediate_size=96)
    msg = check(job_of, "model=hf", f"model.path={ckpt}")
    assert "model.layers.0.mlp.gate_proj.weight has shape [128, 64]" in msg
    assert "[96, 64]" in msg


def test_more_layers_in_the_weights_than_in_config_json(job_of, ckpt):
    edit_config(ckpt, num_hidden_layers=1)
    assert "num_hidden_layers=1" in check(job_of, "model=hf", f"model.path={ckpt}")


def test_token_ids_beyond_the_vocabulary(job_of, ckpt, tmp_path):
    trainer, job = job_of(*text_overrides(ckpt, tmp_path))
    tokens = job.rollout.tokens
    ids = tokens.tokens.copy()
    ids[3] = VOCAB + 3  # as a rollout tokenized for a larger vocabulary would hold
    bad = dataclasses.replace(tokens, tokens=ids)
    with pytest.raises(SlimeHydraError, match=rf"token id {VOCAB + 3} .*vocab_size={VOCAB}"):
        start.check(trainer, dataclasses.replace(job, rollout=RolloutBatch.from_tokens(bad)))


def test_a_tokenizer_larger_than_the_vocabulary(job_of, source, tmp_path):
    small = make_checkpoint(tmp_path / "small", tied=True, vocab_size=260)
    msg = check(job_of, *text_overrides(small, tmp_path), f"data.tokenizer={source}")
    assert "has 300 tokens" in msg and "vocab_size=260" in msg


def test_a_tokenizer_of_another_model_by_its_eos(job_of, ckpt, tmp_path):
    edit_config(ckpt, eos_token_id=0)
    msg = check(job_of, *text_overrides(ckpt, tmp_path))
    assert "ends sequences with id" in msg and "eos_token_id=0" in msg


def test_grpo_7b_needs_model_path_except_in_plan_mode(job_of):
    msg = check(job_of, "+exp=grpo_7b", "trainer=cpu", "parallel.sequence_parallel=false")
    assert "model.path=" in msg and "trainer=plan" in msg and "needs no weights" in msg
    trainer, job = job_of("+exp=grpo_7b", "trainer=plan")
    start.check(trainer, job)


def test_grpo_7b_takes_text_rollouts(compose_cfg, ckpt, tmp_path):
    cfg = compose_cfg("+exp=grpo_7b", f"model.path={ckpt}", "data=text", "data.path=r.jsonl")
    assert cfg.data.tokenizer == str(ckpt) and cfg.model.require_path
