"""SlimeDump reads slime's --save-debug-rollout-data files safely and names what is missing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from slime_hydra.data.slime_dump import SlimeDump
from slime_hydra.data.tokens import grpo_advantages
from slime_hydra.errors import SlimeHydraError


class RewardBox:
    """A custom class: only a full unpickler can rebuild it."""

    def __init__(self, value: float):
        self.value = value


def slime_sample(i: int, group: int, reward: object, prompt: int, resp: int) -> dict:
    """One sample as slime's Sample.to_dict() writes it (the fields that matter here)."""
    return {
        "group_index": group,
        "index": i,
        "prompt": "p",
        "tokens": list(range(1, prompt + resp + 1)),
        "response": "r",
        "response_length": resp,
        "label": None,
        "reward": reward,
        "loss_mask": [1] * (resp - 1) + [0],
        "rollout_log_probs": [-0.5] * resp,
        "status": "completed",
        "metadata": {},
        "spec_info": {"spec_accept_token_num": 0},
    }


def write_dump(path: Path, samples: list) -> str:
    """torch.save a dict in slime's debug rollout format and return its path."""
    torch.save({"rollout_id": 0, "samples": samples}, path)
    return str(path)


def test_reads_a_slime_dump(tmp_path):
    """Tokens, lengths, masks, log-probs and group ids come back; advantages are GRPO."""
    samples = [slime_sample(i, i // 2, float(i % 3), 3 + i, 2 + i) for i in range(6)]
    samples[4]["loss_mask"] = None
    samples[5]["tokens"] = torch.tensor(samples[5]["tokens"])
    batch = SlimeDump(write_dump(tmp_path / "r.pt", samples)).load()
    data = batch.tokens
    assert len(batch) == 6
    np.testing.assert_array_equal(batch.total_lengths, [5 + 2 * i for i in range(6)])
    np.testing.assert_array_equal(batch.response_lengths, [2 + i for i in range(6)])
    np.testing.assert_array_equal(batch.group_ids, [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(data.sample(5)["tokens"], np.arange(1, 16))
    assert data.sample(0)["loss_mask"].tolist() == [True, False]
    assert data.sample(4)["loss_mask"].all()
    np.testing.assert_allclose(data.old_logprobs, -0.5)
    rewards = np.array([i % 3 for i in range(6)], dtype=np.float32)
    want = np.repeat(grpo_advantages(rewards, batch.group_ids), batch.response_lengths)
    np.testing.assert_allclose(data.advantages, want)


def test_dict_reward_needs_reward_key(tmp_path):
    """A dict reward is read through reward_key, and without one the error lists its keys."""
    path = write_dump(tmp_path / "r.pt", [slime_sample(0, 0, {"acc": 1.0, "fmt": 0.0}, 2, 2)])
    assert SlimeDump(path, reward_key="acc").load().tokens.rewards.tolist() == [1.0]
    with pytest.raises(SlimeHydraError, match=r"\['acc', 'fmt'\]"):
        SlimeDump(path).load()


def test_pickle_needing_file_is_refused_unless_trusted(tmp_path):
    """A file holding a custom class is refused by default (never advising to trust it: the
    class is a callable the unpickler would call) and read with trust_pickle=True."""
    path = write_dump(tmp_path / "r.pt", [slime_sample(0, 0, 1.0, 2, 2)])
    obj = torch.load(path, weights_only=True)
    obj["samples"][0]["extra"] = RewardBox(1.0)
    torch.save(obj, path)
    with pytest.raises(SlimeHydraError, match=r"names tests\.\S*RewardBox, which is not") as err:
        SlimeDump(path).load()
    assert "trust_pickle" not in str(err.value)
    assert len(SlimeDump(path, trust_pickle=True).load()) == 1


def test_missing_field_is_named_with_sample_and_file(tmp_path):
    """A sample without tokens or group index is named, with the file it came from."""
    samples = [slime_sample(i, 0, 1.0, 2, 2) for i in range(3)]
    del samples[2]["tokens"]
    path = write_dump(tmp_path / "r.pt", samples)
    with pytest.raises(SlimeHydraError, match=rf"{path}.*sample 2 has no tokens field"):
        SlimeDump(path).load()
    samples = [slime_sample(i, 0, 1.0, 2, 2) for i in range(3)]
    samples[1]["group_index"] = None
    with pytest.raises(SlimeHydraError, match="sample 1 has no group_index / group_id field"):
        SlimeDump(write_dump(tmp_path / "g.pt", samples)).load()


def test_mismatched_lengths_and_partial_logprobs_are_refused(tmp_path):
    """A loss mask of the wrong length, or log-probs on some samples only, is refused."""
    samples = [slime_sample(i, 0, 1.0, 2, 3) for i in range(2)]
    samples[1]["loss_mask"] = [1]
    with pytest.raises(SlimeHydraError, match="sample 1 has 1 loss_mask values"):
        SlimeDump(write_dump(tmp_path / "m.pt", samples)).load()
    samples = [slime_sample(i, 0, 1.0, 2, 3) for i in range(2)]
    samples[1]["rollout_log_probs"] = None
    with pytest.raises(SlimeHydraError, match="sample 1 lacks rollout_log_probs"):
        SlimeDump(write_dump(tmp_path / "l.pt", samples)).load()


def test_not_a_slime_dump_is_refused(tmp_path):
    """A missing file or a file without a samples list gets a clear error."""
    with pytest.raises(SlimeHydraError, match="does not exist"):
        SlimeDump(str(tmp_path / "nope.pt")).load()
    torch.save({"rollout_id": 0}, tmp_path / "x.pt")
    with pytest.raises(SlimeHydraError, match="'samples' list"):
        SlimeDump(str(tmp_path / "x.pt")).load()
