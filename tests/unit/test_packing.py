"""THD packing: next-token alignment, padding, CP zig-zag split, and synthetic tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_hydra.data.packing import pack_microbatch, thd_params
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import (
    DIGIT0_ID,
    SEP_ID,
    RolloutTokens,
    grpo_advantages,
    synthesize_tokens,
)
from slime_hydra.errors import SlimeHydraError
from tests.rollouts import random_tokens


def expected_aligned(data: RolloutTokens, i: int) -> dict[str, np.ndarray]:
    """Sample i's labels and next-token-aligned response values, computed directly."""
    s = data.sample(i)
    tok = s["tokens"]
    n, r = len(tok), int(data.response_lengths[i])
    out = {"labels": np.append(tok[1:], 0)}
    for name in ("loss_mask", "advantages", "old_logprobs"):
        full = np.zeros(n + 1, np.float32)
        full[n - r : n] = s[name]
        out[name] = np.append(full[1:n], 0)
    return out


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 12),
    max_len=st.integers(1, 40),
    cp_size=st.sampled_from([1, 2, 3, 4]),
    pad_multiple=st.sampled_from([2, 8, 128]),
)
def test_cp_chunks_reassemble_each_sequence(seed, n, max_len, cp_size, pad_multiple):
    """Over all CP ranks the zig-zag chunks rebuild every sequence and its aligned values."""
    data = random_tokens(seed, n, max_len)
    idx = np.random.default_rng(seed).permutation(n)
    mbs = [
        pack_microbatch(data, idx, pad_multiple=pad_multiple, cp_size=cp_size, cp_rank=r)
        for r in range(cp_size)
    ]
    cu = mbs[0].cu_seqlens.numpy().astype(np.int64)
    for mb in mbs:
        assert torch.equal(mb.cu_seqlens, mbs[0].cu_seqlens)
        assert mb.tokens.shape[1] % pad_multiple == 0
        assert mb.tokens.shape[1] * cp_size == cu[-1]
        assert mb.max_seqlen == int(np.diff(cu).max())
    fields = ("tokens", "labels", "loss_mask", "advantages", "old_logprobs", "position_ids")
    for k, i in enumerate(idx):
        span = cu[k + 1] - cu[k]
        assert span % (2 * cp_size if cp_size > 1 else 1) == 0
        chunk = span // (2 * cp_size) if cp_size > 1 else span
        full = {f: np.zeros(span, np.float64) for f in fields}
        for r, mb in enumerate(mbs):
            start = cu[k] // cp_size
            local = span // cp_size
            owned = [r] if cp_size == 1 else [r, 2 * cp_size - 1 - r]
            for j, c in enumerate(owned):
                for f in fields:
                    row = getattr(mb, f)[0, start + j * chunk : start + (j + 1) * chunk]
                    full[f][c * chunk : (c + 1) * chunk] = row.numpy()
            assert local == len(owned) * chunk
        length = int(data.total_lengths[i])
        want = expected_aligned(data, i)
        np.testing.assert_array_equal(full["tokens"][:length], data.sample(i)["tokens"])
        np.testing.assert_array_equal(full["position_ids"], np.arange(span))
        for f in ("labels", "loss_mask", "advantages", "old_logprobs"):
            np.testing.assert_allclose(full[f][:length], want[f], rtol=1e-6)
            assert not full[f][length:].any()
    assert len({mb.tokens.shape[1] for mb in mbs}) == 1


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), cp_size=st.sampled_from([2, 4]))
def test_cp_real_token_load_differs_by_at_most_one_chunk(seed, n, cp_size):
    """Per sequence, CP ranks' real (non-padding) tokens differ by at most one chunk."""
    data = random_tokens(seed, n, 64)
    mbs = [
        pack_microbatch(data, range(n), pad_multiple=2, cp_size=cp_size, cp_rank=r)
        for r in range(cp_size)
    ]
    cu = mbs[0].cu_seqlens.numpy().astype(np.int64)
    for k in range(n):
        chunk = (cu[k + 1] - cu[k]) // (2 * cp_size)
        start, stop = cu[k] // cp_size, cu[k + 1] // cp_size
        pos = [mb.position_ids[0, start:stop].numpy() for mb in mbs]
        real = [int((p < data.total_lengths[k]).sum()) for p in pos]
        assert max(real) - min(real) <= chunk


def test_padding_is_one_pseudo_sequence_out_of_the_loss():
    """Padding to pad_multiple appends one span to cu_seqlens and never enters the loss."""
    data = random_tokens(0, 3, 20)
    mb = pack_microbatch(data, [0, 1, 2], pad_multiple=128)
    n = int(data.total_lengths.sum())
    assert mb.tokens.shape == (1, 128) and mb.tokens.dtype == torch.int64
    assert mb.cu_seqlens.dtype == torch.int32
    assert mb.cu_seqlens.tolist()[-2:] == [n, 128]
    assert not mb.loss_mask[0, n:].any() and not mb.labels[0, n:].any()
    assert mb.num_tokens == n
    exact = pack_microbatch(data, [0, 1, 2], pad_multiple=1)
    assert exact.cu_seqlens.tolist()[-1] == n and len(exact.cu_seqlens) == 4


def test_packed_seq_params_is_thd():
    """The PackedSeqParams built for megatron uses cu_seqlens and max_seqlen for q and kv, and
    carries the same boundaries as Python ints for the packed attention."""
    mb = pack_microbatch(random_tokens(1, 4, 30), [3, 1], pad_multiple=8, cp_size=2, cp_rank=1)
    p = mb.packed_seq_params()
    assert p.qkv_format == "thd"
    assert torch.equal(p.cu_seqlens_q, mb.cu_seqlens) and torch.equal(
        p.cu_seqlens_kv, mb.cu_seqlens
    )
    assert p.max_seqlen_q == p.max_seqlen_kv == mb.max_seqlen
    assert p.bounds == tuple(mb.cu_seqlens.tolist()) and p.cu_seqlens_q.device.type == "cpu"


def test_thd_params_by_hand():
    p = thd_params([0, 5, 12, 16])
    assert p.bounds == (0, 5, 12, 16) and p.max_seqlen_q == p.max_seqlen_kv == 7
    assert p.cu_seqlens_q.tolist() == [0, 5, 12, 16] and p.cu_seqlens_q.dtype == torch.int32
    assert p.cu_seqlens_kv is p.cu_seqlens_q


def test_synthesize_tokens_copy_task():
    """Prompts are digits then SEP, rewards are the right-token fraction, advantages are GRPO."""
    total = np.array([12, 9, 30, 7, 15, 40])
    resp = np.array([5, 4, 20, 3, 15, 10])
    groups = np.array([0, 0, 0, 1, 1, 1])
    data = synthesize_tokens(total, resp, groups, vocab_size=16, seed=3)
    again = synthesize_tokens(total, resp, groups, vocab_size=16, seed=3)
    np.testing.assert_array_equal(data.tokens, again.tokens)
    np.testing.assert_array_equal(data.old_logprobs, again.old_logprobs)
    for i in range(len(total)):
        tok = data.sample(i)["tokens"]
        p = total[i] - resp[i]
        digits = tok[: p - 1] if p >= 2 else np.array([DIGIT0_ID])
        if p >= 1:
            assert tok[p - 1] == SEP_ID
        assert np.all((digits >= DIGIT0_ID) & (digits < DIGIT0_ID + 10))
        target = digits[np.arange(resp[i]) % len(digits)]
        assert data.rewards[i] == pytest.approx(np.mean(tok[p:] == target))
        assert np.all(data.sample(i)["old_logprobs"] < 0)
    np.testing.assert_allclose(
        data.advantages, np.repeat(grpo_advantages(data.rewards, groups), resp)
    )
    per_group = [
        data.advantages[data.response_offsets[g * 3] : data.response_offsets[g * 3 + 3]]
        for g in range(2)
    ]
    assert all(np.ptp(a) > 0 for a in per_group)


def test_grpo_advantages_normalise_within_groups():
    """Each group's advantages have mean 0 and unit population std; a lone sample gets 0."""
    adv = grpo_advantages(np.array([1.0, 0.0, 0.5, 0.25, 7.0]), np.array([4, 4, 9, 9, 2]))
    np.testing.assert_allclose(adv, [1, -1, 1, -1, 0], atol=1e-5)


def test_too_small_vocab_is_refused():
    """The copy task needs twelve ids; a smaller vocabulary is named in the error."""
    with pytest.raises(SlimeHydraError, match="vocab_size=8"):
        synthesize_tokens(np.array([4]), np.array([2]), np.array([0]), vocab_size=8, seed=0)


def test_batch_refuses_tokens_that_disagree_with_its_lengths():
    """RolloutBatch checks that linked tokens have its lengths."""
    data = random_tokens(2, 3, 10)
    batch = RolloutBatch.from_tokens(data)
    with pytest.raises(SlimeHydraError, match="differ"):
        type(batch)(
            total_lengths=batch.total_lengths + 1,
            response_lengths=batch.response_lengths,
            group_ids=batch.group_ids,
            tokens=data,
        )
