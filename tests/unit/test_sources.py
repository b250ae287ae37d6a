"""Rollout sources: synthetic GRPO shape, jsonl traces and their errors."""

from __future__ import annotations

import numpy as np
import pytest

from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.data.trace import JsonlTrace, ParquetTrace
from slime_hydra.errors import SlimeHydraError


def test_synthetic_grpo_is_seeded_grouped_and_clipped():
    src = SyntheticGRPO(num_prompts=32, n_samples_per_prompt=4, max_response_len=2048, seed=7)
    a, b = src.load(), src.load()
    assert np.array_equal(a.total_lengths, b.total_lengths)
    assert len(a) == 128
    assert list(a.group_ids[:8]) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert a.response_lengths.max() == 2048  # truncated samples pile up at the max
    prompts = a.total_lengths - a.response_lengths
    for g in range(32):
        assert len(set(prompts[a.group_ids == g])) == 1  # one prompt per group
    other = SyntheticGRPO(num_prompts=32, n_samples_per_prompt=4, seed=8).load()
    assert not np.array_equal(a.total_lengths, other.total_lengths)


def test_jsonl_reads_lengths_groups_and_steps(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"total_length": 10, "response_length": 4, "group": 3, "step": 1}\n'
        "\n"
        '{"total_length": 7, "group": 3, "step": 1}\n'
    )
    batch = JsonlTrace(str(path)).load()
    assert list(batch.total_lengths) == [10, 7]
    assert list(batch.response_lengths) == [4, 7]
    assert list(batch.group_ids) == [3, 3]
    assert list(batch.step_ids) == [1, 1]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"total_length": 5}\nnot json\n', ":2: not valid JSON"),
        ('{"total_length": 2.5}\n', "total_length=2.5"),
        ('{"total_length": -1}\n', "total_length=-1"),
        ('{"total_length": true}\n', "total_length=True"),
        ('{"response_length": 3}\n', "total_length field"),
        ('{"total_length": 5, "step": 0}\n{"total_length": 5}\n', "`step` is on some records"),
        (
            '{"total_length": 5, "response_length": 9}\n',
            "response_length=9 is more than total_length=5",
        ),
        ("", "rollout is empty"),
    ],
)
def test_jsonl_errors_name_the_problem(tmp_path, text, needle):
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    with pytest.raises(SlimeHydraError) as err:
        JsonlTrace(str(path)).load()
    assert needle in str(err.value)


def test_jsonl_missing_file_names_the_override(tmp_path):
    with pytest.raises(SlimeHydraError, match=r"data\.path"):
        JsonlTrace(str(tmp_path / "nope.jsonl")).load()


def test_parquet_trace_reads_the_same_fields(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    table = pa.table({"total_length": [10, 7], "response_length": [4, None], "group": [3, 3]})
    pq.write_table(table, path)
    batch = ParquetTrace(str(path)).load()
    assert list(batch.total_lengths) == [10, 7]
    assert list(batch.response_lengths) == [4, 7]
    assert batch.step_ids is None


def test_parquet_bad_row_and_bad_file_are_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"total_length": [10, -3]}), path)
    with pytest.raises(SlimeHydraError, match="row 1: total_length=-3"):
        ParquetTrace(str(path)).load()
    path.write_text("not parquet")
    with pytest.raises(SlimeHydraError, match="not a readable Parquet file"):
        ParquetTrace(str(path)).load()
