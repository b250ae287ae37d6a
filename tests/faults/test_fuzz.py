"""Fuzzing the readers and the numeric config keys: every input either loads or gets our error
(SlimeHydraError: one paragraph), never another exception. Bytes are drawn raw (any encoding,
torn anywhere) and as near-valid structures (JSON records with values of every type, nested
deep), since near-valid input is where a reader stops checking."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_hydra.config import validate
from slime_hydra.data.slime_dump import SlimeDump
from slime_hydra.data.text import TextRollouts
from slime_hydra.data.trace import JsonlTrace, ParquetTrace
from slime_hydra.errors import SlimeHydraError
from slime_hydra.hf.checkpoint import HfCheckpoint
from slime_hydra.log.jsonl import rows_done
from slime_hydra.report.rundir import RunDir
from slime_hydra.rundir import claim
from slime_hydra.train.run.checkpoint import latest_step
from tests.hf_models import train_tokenizer

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def record(keys: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object with some of `keys` (values of any JSON type) and perhaps a stray key."""
    return st.dictionaries(st.sampled_from([*keys, "extra"]), JSON, max_size=len(keys) + 1)


def deep(depth: int) -> bytes:
    """A JSON array nested `depth` levels (past the interpreter's recursion limit)."""
    return b"[" * depth + b"]" * depth


def lines_of(records: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    """JSON Lines of `records`, then perhaps torn at any byte, with junk or deep nesting."""
    text = st.lists(records, min_size=1, max_size=4).map(
        lambda rs: "".join(json.dumps(r) + "\n" for r in rs).encode()
    )
    junk = st.sampled_from([b"", b"\xff\xfe", "é".encode("latin-1"), b"\x1f\x8b\x08", deep(5000)])
    return st.tuples(text, st.integers(min_value=0, max_value=400), junk).map(
        lambda t: t[0][: t[1] or None] + t[2]
    )


ANY_BYTES = st.binary(max_size=300)


def loads_or_our_error(load: Callable[[], object]) -> None:
    """`load()` returns, or raises SlimeHydraError; anything else fails the test."""
    try:
        load()
    except SlimeHydraError as exc:
        assert str(exc).strip(), "an empty message"


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    """One scratch dir for every example (hypothesis reruns a test body many times)."""
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


TRACE_KEYS = ("total_length", "response_length", "group", "step")


@SETTINGS
@given(data=ANY_BYTES | lines_of(record(TRACE_KEYS)))
def test_jsonl_trace(work, data):
    (work / "t.jsonl").write_bytes(data)
    loads_or_our_error(lambda: JsonlTrace(str(work / "t.jsonl")).load())


@SETTINGS
@given(data=ANY_BYTES)
def test_parquet_trace(work, data):
    (work / "t.parquet").write_bytes(data)
    loads_or_our_error(lambda: ParquetTrace(str(work / "t.parquet")).load())


@pytest.fixture(scope="module")
def tokenizer(work) -> str:
    train_tokenizer(work / "tok")
    return str(work / "tok")


@SETTINGS
@given(
    data=ANY_BYTES
    | lines_of(record(("prompt", "response", "reward")))
    | st.sampled_from([b'{"prompt": "\\ud800", "response": "x", "reward": 1}\n'])
)
def test_text_rollouts(work, tokenizer, data):
    (work / "r.jsonl").write_bytes(data)
    loads_or_our_error(lambda: TextRollouts(str(work / "r.jsonl"), tokenizer).load())


SAMPLE_KEYS = ("tokens", "response_length", "reward", "group_index", "loss_mask", "advantages")
TENSORS = st.sampled_from(
    [
        torch.tensor(5),
        torch.tensor([1, 2, 3]),
        torch.zeros(2, 2),
        torch.tensor([0.5, 2.0, -3.0]),
        torch.tensor(True),
        torch.tensor([float("nan")]),
        torch.tensor([], dtype=torch.int64),
    ]
)
SAMPLE_VALUES = JSON | TENSORS | st.lists(st.integers(-3, 2**64), max_size=4)


@SETTINGS
@given(
    data=ANY_BYTES,
    samples=st.lists(
        st.dictionaries(st.sampled_from(SAMPLE_KEYS), SAMPLE_VALUES, max_size=6), max_size=3
    ),
    raw=st.booleans(),
)
def test_slime_dump(work, data, samples, raw):
    path = work / "d.pt"
    if raw:
        path.write_bytes(data)
    else:
        torch.save({"rollout_id": 0, "samples": samples}, path)
    loads_or_our_error(lambda: SlimeDump(str(path)).load())


CONFIG = {"parallel": {"dp": 2}, "trainer": {"resume": True, "lr": 0.001}, "seed": 1}


@SETTINGS
@given(data=ANY_BYTES | JSON.map(lambda v: json.dumps(v).encode()) | st.just(deep(5000)))
def test_config_yaml_on_resume(work, data):
    run = work / "run"
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_bytes(data)
    loads_or_our_error(lambda: claim(run, CONFIG, resume=True))


@SETTINGS
@given(data=ANY_BYTES | lines_of(record(("step", "train/loss"))), done=st.integers(0, 10))
def test_metrics_jsonl(work, data, done):
    run = work / "m"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_bytes(data)
    loads_or_our_error(lambda: rows_done(run / "metrics.jsonl", done))
    loads_or_our_error(lambda: RunDir.read(run))


@SETTINGS
@given(data=ANY_BYTES | st.text(max_size=12).map(str.encode))
def test_checkpoints_latest(work, data):
    (work / "c/checkpoints").mkdir(parents=True, exist_ok=True)
    (work / "c/checkpoints/latest").write_bytes(data)
    try:
        steps = latest_step(work / "c")
    except SlimeHydraError:
        return
    assert isinstance(steps, int) and steps >= 1
    assert data.strip().decode("ascii").isdigit()  # no other digits, signs or spaces inside


HF_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
)
QWEN = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 16,
    "vocab_size": 32,
}


@SETTINGS
@given(
    data=ANY_BYTES,
    changes=st.dictionaries(st.sampled_from(HF_KEYS), JSON, max_size=3),
    raw=st.booleans(),
)
def test_hf_config_json(work, data, changes, raw):
    (work / "hf").mkdir(exist_ok=True)
    config = data if raw else json.dumps({**QWEN, **changes}).encode()
    (work / "hf/config.json").write_bytes(config)
    loads_or_our_error(lambda: HfCheckpoint.open(work / "hf").dims())


NUMERIC_KEYS = (
    "seed",
    "batching.global_batch_size",
    "batching.max_tokens_per_gpu",
    "batching.count_margin",
    "parallel.dp",
    "parallel.tp",
    "parallel.pp",
    "parallel.vpp",
    "parallel.cp",
    "data.num_prompts",
    "data.n_samples_per_prompt",
    "data.max_response_len",
    "model.num_layers",
    "model.hidden_size",
    "model.ffn_hidden_size",
    "model.num_attention_heads",
    "model.num_query_groups",
    "model.vocab_size",
    "model.kv_channels",
    "iterator.pad_multiple",
)
NUMBERS = (
    st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64, 3])
    | st.floats(allow_nan=True, allow_infinity=True)
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(key=st.sampled_from(NUMERIC_KEYS), value=NUMBERS)
def test_numeric_config_keys(compose_cfg, key, value):
    try:
        cfg = compose_cfg("trainer=plan", "logger=jsonl", f"{key}={value}")
    except Exception as exc:  # Hydra refuses a wrong type at composition, as one message
        assert type(exc).__module__.startswith(("hydra", "omegaconf")), exc
        return
    loads_or_our_error(lambda: validate(cfg))
