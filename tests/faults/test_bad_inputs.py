"""Every bad input of issue 11 gets one clear SlimeHydraError (value and fix, file:line for
traces) from the source, config or trainer check that runs before any worker starts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import timeit
from pathlib import Path

import numpy as np
import pytest
import torch

from slime_hydra.config import check_keys, validate
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.slime_dump import SlimeDump
from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.data.text import TextRollouts
from slime_hydra.data.tokens import RolloutTokens
from slime_hydra.data.trace import JsonlTrace, ParquetTrace
from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import read_text
from slime_hydra.log.jsonl import rows_done
from slime_hydra.schedule import ParallelLayout
from slime_hydra.train.run.checkpoint import latest_step
from slime_hydra.train.run.checks import check_gpu_count, check_knobs, check_rollout_fits
from slime_hydra.train.run.plan import check_plan
from slime_hydra.train.settings import PlanTrainer
from tests.hf_models import train_tokenizer

# -- jsonl / parquet traces -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ('{"total_length": 5, "group": "g0"}', [":2:", "group='g0'", "integer"]),
        ('{"total_length": 5, "step": "a"}', [":2:", "step='a'"]),
        ('{"total_length": 5, "group": 0.3}', [":2:", "group=0.3", "not rounded"]),
        ('{"total_length": 5, "step": 0.5}', [":2:", "step=0.5"]),
        ('{"total_length": 5, "step": -1}', [":2:", "step=-1", "≥ 0"]),
        ('{"total_length": 99999999999999999999999}', [":2:", "64-bit"]),
        ('{"total_length": 5, "group": 99999999999999999999999}', [":2:", "64-bit"]),
        ('{"total_length": 5, "response_length": 1e400}', [":2:", "response_length=inf"]),
    ],
)
def test_jsonl_field_errors_name_file_line_and_value(tmp_path, line, needles):
    path = tmp_path / "t.jsonl"
    first = (
        '{"total_length": 4, "group": 1, "step": 0}' if '"step"' in line else '{"total_length": 4}'
    )
    path.write_text(f"{first}\n{line}\n")
    with pytest.raises(SlimeHydraError) as err:
        JsonlTrace(str(path)).load()
    for needle in [str(path), *needles]:
        assert needle in str(err.value)


def test_float_groups_do_not_merge_and_missing_groups_do_not_collide(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"total_length": 4, "group": -1}\n{"total_length": 5}\n{"total_length": 6}\n')
    groups = JsonlTrace(str(path)).load().group_ids
    assert len(set(groups.tolist())) == 3 and groups[0] == -1  # three groups, -1 kept


def test_parquet_string_group_column_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"total_length": [4, 5], "group": ["a", "b"]}), path)
    with pytest.raises(SlimeHydraError, match=r"row 0: group='a' is not an integer"):
        ParquetTrace(str(path)).load()


# -- slime dumps ------------------------------------------------------------------------------


def sample(**over: object) -> dict:
    base = {
        "group_index": 0,
        "tokens": [1, 2, 3, 4, 5],
        "response_length": 2,
        "reward": 1.0,
        "rollout_log_probs": [-0.1, -0.2],
    }
    return {**base, **over}


def dump(tmp_path: Path, *samples: dict) -> str:
    path = tmp_path / "rollout_0.pt"
    torch.save({"rollout_id": 0, "samples": list(samples)}, path)
    return str(path)


@pytest.mark.parametrize(
    ("over", "needles"),
    [
        ({"reward": torch.tensor([1.0, 2.0, 3.0])}, ["sample 1 reward has shape [3]", "scalar"]),
        ({"reward": float("nan")}, ["sample 1 reward=nan is not finite"]),
        ({"group_index": "x"}, ["sample 1 group='x' is not an integer"]),
        ({"group_index": 0.3}, ["sample 1 group=0.3", "never rounded"]),
        ({"tokens": torch.arange(50).reshape(5, 10)}, ["tokens has shape [5, 10]", "1-D"]),
        ({"rollout_log_probs": [[-0.1], [-0.2]]}, ["rollout_log_probs has shape [2, 1]"]),
        ({"rollout_log_probs": [-0.1, float("inf")]}, ["rollout_log_probs[1]=inf"]),
        ({"advantage": float("nan")}, ["advantage=nan is not finite"]),
        ({"tokens": [1, -2, 3, 4, 5]}, ["not non-negative integer ids"]),
    ],
)
def test_malformed_dump_fields_are_named(tmp_path, over, needles):
    adv = {"advantage": 0.5} if "advantage" in over else {}
    path = dump(tmp_path, sample(**adv), sample(**over))
    with pytest.raises(SlimeHydraError) as err:
        SlimeDump(path).load()
    for needle in needles:
        assert needle in str(err.value)


def test_truncated_dump_is_named_without_advising_trust_pickle(tmp_path):
    path = dump(tmp_path, sample())
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2])
    with pytest.raises(SlimeHydraError, match=r"not a readable torch\.save file") as err:
        SlimeDump(path).load()
    assert "trust_pickle=true" not in str(err.value)


def test_garbage_dump_does_not_invite_trust_pickle(tmp_path):
    path = tmp_path / "rollout_0.pt"
    path.write_bytes(b"\x80\x04garbage, not a torch file")
    with pytest.raises(SlimeHydraError, match=r"not a readable torch\.save file") as err:
        SlimeDump(str(path)).load()
    assert "trust_pickle=true" not in str(err.value)


class RunsCode:
    """A pickle that calls `call(*args)` when loaded (the callables a denylist misses)."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return (self.call, self.args)


@pytest.mark.parametrize(
    ("call", "args", "named"),
    [
        (os.system, ("touch {marker}",), "system"),
        (timeit.timeit, ("open({marker!r}, 'w')",), "timeit.timeit"),
        # torch.save's pickle protocol 2 writes it under its Python 2 name.
        (subprocess.Popen, (["touch", "{marker}"],), "commands.Popen"),
    ],
)
def test_a_dump_naming_any_callable_is_refused_by_the_allowlist_and_runs_nothing(
    tmp_path, call, args, named
):
    marker = tmp_path / "pwned"
    args = tuple(
        a.format(marker=str(marker))
        if isinstance(a, str)
        else [x.format(marker=str(marker)) for x in a]
        for a in args
    )
    path = tmp_path / "rollout_0.pt"
    torch.save({"rollout_id": 0, "samples": [sample(reward=RunsCode(call, *args))]}, path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(SlimeHydraError, match="which is not a tensor or a plain container") as err:
        SlimeDump(str(path)).load()
    assert named in str(err.value)
    assert "trust_pickle" not in str(err.value)
    assert not marker.exists()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


# -- config -----------------------------------------------------------------------------------


def test_jsonl_without_a_path_says_which_override_to_add(compose_cfg):
    with pytest.raises(SlimeHydraError, match=r"data\.path must be set: add data\.path=\.\.\."):
        validate(compose_cfg("data=jsonl", "trainer=plan"))


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("+parallel.dpp=4", "parallel.dpp is not a setting.*parallel.dp"),
        ("+data.num_prompt=4", "data.num_prompt is not a setting.*data.num_prompts"),
        ("+trainer.learning_rate=1", "trainer.learning_rate is not a setting"),
        ("+batching.partitioner.tolerence=1", "Did you mean batching.partitioner.tolerance"),
        ("+seeds=3", "seeds is not a setting.*Did you mean seed"),
        ("+iterator.pad=3", "iterator.pad is not a setting.*settings there are: pad_multiple"),
        ("+iterator.dp_rank=3", "iterator.dp_rank is not a setting"),  # a runtime argument
    ],
)
def test_an_added_key_nothing_reads_is_an_error(compose_cfg, override, needle):
    with pytest.raises(SlimeHydraError, match=needle):
        check_keys(compose_cfg(override))


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["seed=-1"], "seed=-1 is not a seed numpy and torch accept"),
        (["seed=4294967296"], "seed=4294967296 is not a seed"),
        (["batching.max_tokens_per_gpu=99999999999999999999"], "does not fit a 64-bit integer"),
        (["model.num_layers=0"], "model.num_layers=0 is not a positive integer"),
        (["model.num_layers=-1"], "model.num_layers=-1 is not a positive integer"),
        (["model.hidden_size=0"], "model.hidden_size=0 is not a positive integer"),
        (["model.vocab_size=-5"], "model.vocab_size=-5 is not a positive integer"),
        (["model.num_attention_heads=0"], "model.num_attention_heads=0 is not a positive"),
        (["model.num_attention_heads=abc"], "model.num_attention_heads='abc' is not a number"),
        (["model.norm_epsilon=-1"], "model.norm_epsilon=-1 is not a finite number above 0"),
        (["parallel.tp=3"], "model.num_attention_heads=4 does not split over parallel.tp=3"),
        (["data.n_samples_per_prompt=0"], "data.n_samples_per_prompt=0 must be a positive"),
        (["batching.partitioner.budget=-1"], r"batching.partitioner.budget=-1 must be >= 0"),
        (
            ["batching.partitioner.budget_per_sample=-5"],
            r"batching.partitioner.budget_per_sample=-5 must be >= 0 item visits",
        ),
    ],
)
def test_what_the_workers_would_reject_is_refused_before_launch(compose_cfg, overrides, needle):
    with pytest.raises(SlimeHydraError, match=needle):
        validate(compose_cfg("trainer=plan", "logger=jsonl", *overrides))


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_a_wandb_init_timeout_that_is_no_positive_time_is_refused(compose_cfg, value):
    """logger.init_timeout=-1 was accepted (and handed to wandb.init as it is)."""
    with pytest.raises(SlimeHydraError, match=r"logger.init_timeout=.* must be a positive number"):
        validate(compose_cfg("trainer=plan", "logger=wandb", f"logger.init_timeout={value}"))


def test_a_synthetic_rollout_far_larger_than_memory_is_refused_before_drawing():
    with pytest.raises(SlimeHydraError, match=r"= 800000000 samples need about 763 GiB to plan"):
        SyntheticGRPO(num_prompts=100_000_000)


def test_an_hf_config_json_with_bad_dims_is_named_never_coerced(tmp_path, compose_cfg):
    (tmp_path / "config.json").write_text(
        '{"model_type": "qwen2", "hidden_size": 8, "num_attention_heads": "2", '
        '"num_hidden_layers": 1, "intermediate_size": 16, "vocab_size": 32}'
    )
    cfg = compose_cfg("trainer=plan", "logger=jsonl", "model=hf", f"model.path={tmp_path}")
    needle = "config.json: num_attention_heads='2' is not a positive integer"
    with pytest.raises(SlimeHydraError, match=needle):
        validate(cfg)
    (tmp_path / "config.json").write_text(
        (tmp_path / "config.json").read_text().replace('"2"', "2").replace("32}", "-5}")
    )
    with pytest.raises(SlimeHydraError, match="vocab_size=-5 is not a positive integer"):
        validate(cfg)


def test_a_dump_loss_mask_must_select_not_weight(tmp_path):
    mask = [0.5, 2, -3, 1, 1]
    path = dump(tmp_path, sample(loss_mask=mask, response_length=5, rollout_log_probs=[-0.1] * 5))
    with pytest.raises(SlimeHydraError, match=r"loss_mask\[0\]=0.5 is not 0 or 1"):
        SlimeDump(path).load()


def test_a_boolean_reward_is_named_as_such(tmp_path):
    with pytest.raises(SlimeHydraError, match="reward=True is a boolean"):
        SlimeDump(dump(tmp_path, sample(reward=True))).load()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b'{"total_length": 4}\n\xe9\n', ":2: not UTF-8 text (byte 0xe9 at column 1)"),
        (b"\x1f\x8b\x08\x00", ":1: not UTF-8 text (it is gzip-compressed"),
        (b"[" * 100000 + b"]" * 100000, ":1: JSON nested deeper than 200 levels"),
        (b'{"total_length": 4, "response_length": 5}', "response_length=5 is more than total"),
        (b'{"total_length": 4, "group": 9223372036854775807}', None),
        (  # json.loads kept the last value silently
            b'{"total_length": 4}\n{"total_length": 100, "total_length": 2}',
            ":2: an object names the key 'total_length' twice",
        ),
    ],
)
def test_trace_bytes_and_structure_are_named_by_line(tmp_path, data, needle):
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    if needle is None:  # the largest int64 group: valid, and no "no free group id" message
        assert JsonlTrace(str(path)).load().group_ids.tolist() == [2**63 - 1]
        return
    with pytest.raises(SlimeHydraError) as err:
        JsonlTrace(str(path)).load()
    assert f"{path}{needle}" in str(err.value) or needle in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"achieved_tflops": 0.0}, "trainer.achieved_tflops=0.0"),
        ({"achieved_tflops": -1.0}, "trainer.achieved_tflops=-1.0"),
        ({"microbatch_overhead_ms": float("nan")}, "trainer.microbatch_overhead_ms=nan"),
        ({"memory_limit_gib": 0.0}, "trainer.memory_limit_gib=0.0"),
    ],
)
def test_plan_cost_model_knobs_must_be_positive(kwargs, needle):
    with pytest.raises(SlimeHydraError, match=needle):
        check_plan(PlanTrainer(**kwargs))


def test_trainer_knobs_are_checked():
    with pytest.raises(SlimeHydraError, match=r"trainer.lr=-0.1 must be a finite number at least"):
        check_knobs("trainer", lr=(-0.1, 0.0, None))
    with pytest.raises(SlimeHydraError, match=r"eps_clip=1.5 .* in \[0.0, 1.0\)"):
        check_knobs("trainer", eps_clip=(1.5, 0.0, 1.0))


# -- what the trainer would allocate ----------------------------------------------------------


def lengths_only(lengths: list[int]) -> RolloutBatch:
    n = len(lengths)
    return RolloutBatch(np.array(lengths), np.array(lengths) // 2, np.arange(n))


def test_a_sample_longer_than_the_model_stops_before_any_allocation():
    rollout = lengths_only([100, 10**12, 50])
    with pytest.raises(SlimeHydraError, match=r"sample 1 has 1,000,000,000,000 tokens.*4096"):
        check_rollout_fits(rollout, {"max_position_embeddings": 4096, "vocab_size": 256}, 2)


def test_a_rollout_bigger_than_memory_is_refused():
    rollout = lengths_only([10**12] * 8)
    with pytest.raises(SlimeHydraError, match="GiB"):
        check_rollout_fits(rollout, {"vocab_size": 256}, 2)


def test_token_ids_outside_the_vocabulary_are_named():
    tokens = RolloutTokens.from_samples(
        tokens=[[1, 2, 3, 4], [5, 300, 7]],
        response_lengths=[2, 1],
        loss_masks=[[1, 1], [1]],
        rewards=[1.0, 0.0],
        group_ids=[0, 0],
    )
    with pytest.raises(SlimeHydraError, match=r"sample 1 holds token id 300 \(position 1\).*256"):
        check_rollout_fits(RolloutBatch.from_tokens(tokens), {"vocab_size": 256}, 2)


def test_gpu_count_is_checked_against_the_layout():
    with pytest.raises(SlimeHydraError, match=r"starts 8 workers .* has 2 CUDA GPU"):
        check_gpu_count(ParallelLayout(dp=2, tp=4), 8, 2)
    check_gpu_count(ParallelLayout(dp=2, tp=4), 8, 8)


# -- text rollouts: what the tokenizer itself refuses -----------------------------------------

STRICT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(path)
    return path


@pytest.mark.parametrize(
    ("template", "prompt", "needle"),
    [
        (
            STRICT_TEMPLATE,
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            "r.jsonl:2: the tokenizer in {tok} cannot encode the prompt (TemplateError: "
            "Conversation roles must alternate user/assistant/user/assistant/...); fix the "
            "record, or its chat template, or set data.chat_template=false",
        ),
        (
            "{% for message in messages %}{{ message['content'] }}",
            "Hi",
            "r.jsonl:1: the tokenizer in {tok} cannot encode the prompt (TemplateSyntaxError: ",
        ),
    ],
    ids=["raise_exception", "syntax_error"],
)
def test_a_prompt_the_chat_template_refuses_names_file_and_line(
    tmp_path, tokenizer_dir, template, prompt, needle
):
    tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dir, tok)
    (tok / "chat_template.jinja").write_text(template)
    records = [{"prompt": "Hi", "response": "ok", "reward": 1.0}]
    records.append({"prompt": prompt, "response": "ok", "reward": 0.0})
    if isinstance(prompt, str):
        records.reverse()
    data = tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SlimeHydraError) as err:
        TextRollouts(str(data), str(tok)).load()
    assert needle.format(tok=tok) in str(err.value)


# -- files a reader must not read whole: bigger than memory, FIFOs ----------------------------

HUGE = 2**43
"""A sparse file's size (8 TiB): more memory than any machine these tests run on has."""


def sparse(path: Path, size: int = HUGE) -> Path:
    with path.open("wb") as f:
        f.truncate(size)
    return path


def test_a_trace_bigger_than_memory_is_refused_before_reading_it(tmp_path):
    with pytest.raises(SlimeHydraError) as err:
        JsonlTrace(str(sparse(tmp_path / "t.jsonl"))).load()
    assert f"data.path {tmp_path / 't.jsonl'} holds {HUGE:,} bytes, more than the " in str(
        err.value
    )
    assert "reading it would be killed for memory" in str(err.value)


def test_a_metrics_file_bigger_than_memory_is_refused(tmp_path):
    with pytest.raises(SlimeHydraError, match=r"the metrics file .* holds 8,796,093,022,208 bytes"):
        rows_done(sparse(tmp_path / "metrics.jsonl"), steps_done=0)


def test_a_huge_latest_file_is_read_no_further_than_a_count(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    sparse(tmp_path / "checkpoints" / "latest")
    with pytest.raises(SlimeHydraError, match=r"holds '\\x00.*', not a step count"):
        latest_step(tmp_path)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(SlimeHydraError, match=r"is not a regular file \(a FIFO, device or socket"):
        read_text(fifo, "the checkpoint's config", "fix it.")


@pytest.mark.parametrize("source", ["trace", "text"])
@pytest.mark.parametrize("kind", ["garbage", "fifo"])
def test_a_parquet_file_that_cannot_be_read_is_one_line_naming_it(
    tmp_path, tokenizer_dir, source, kind
):
    """pyarrow's reason held a newline, so the paragraph broke in two; a FIFO is refused before
    pyarrow sees it (both Parquet sources now read through one reader)."""
    path = tmp_path / "rollouts.parquet"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(b"PAR1" + b"\0" * 100 + b"PAR1")
    text = TextRollouts(str(path), str(tokenizer_dir))
    load = ParquetTrace(str(path)).load if source == "trace" else text.load
    with pytest.raises(SlimeHydraError) as err:
        load()
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    if kind == "fifo":
        assert "is not a file" in message or "not a regular file (a FIFO" in message
    else:
        assert message.startswith(f"{path}: not a readable Parquet file (")
