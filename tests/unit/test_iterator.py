"""MicrobatchIterator over a rank's schedule: round trip, token counts, loss means, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import RolloutTokens
from slime_hydra.errors import SlimeHydraError
from tests.rollouts import random_tokens


def random_batch(seed: int, n: int, max_len: int) -> RolloutBatch:
    """A rollout of random tokens with random loss masks and per-token values."""
    return RolloutBatch.from_tokens(random_tokens(seed, n, max_len))


@st.composite
def rank_schedules(draw: st.DrawFn) -> tuple[int, int, list[list[int]]]:
    """A seed, a rollout size and a random split of a random subset into non-empty micro-batches."""
    seed = draw(st.integers(0, 10_000))
    n = draw(st.integers(1, 30))
    rng = np.random.default_rng(seed)
    chosen = rng.permutation(n)[: draw(st.integers(1, n))]
    cuts = sorted(
        rng.choice(np.arange(1, len(chosen)), size=min(3, len(chosen) - 1), replace=False)
    )
    return seed, n, [part.tolist() for part in np.split(chosen, cuts)]


@settings(max_examples=80, deadline=None)
@given(sched=rank_schedules(), pad_multiple=st.sampled_from([1, 16, 128]))
def test_round_trip_gives_each_sample_back_once(sched, pad_multiple):
    """Unpacking every micro-batch yields each scheduled sample's tokens and mask exactly once."""
    seed, n, microbatches = sched
    batch = random_batch(seed, n, 50)
    data = batch.tokens
    it = MicrobatchIterator(batch, microbatches, step=3, dp_rank=1, pad_multiple=pad_multiple)
    seen = []
    for mb, want in zip(it, microbatches, strict=True):
        assert mb.sample_indices.tolist() == want
        assert mb.num_tokens == int(data.total_lengths[want].sum())
        cu = mb.cu_seqlens.tolist()
        assert cu[-1] == mb.tokens.shape[1] and mb.tokens.shape[1] % pad_multiple == 0
        for k, i in enumerate(want):
            s = data.sample(i)
            tok = mb.tokens[0, cu[k] : cu[k + 1]].numpy()
            np.testing.assert_array_equal(tok, s["tokens"])
            prompt = len(tok) - len(s["loss_mask"])
            mask = mb.loss_mask[0, cu[k] : cu[k + 1]].numpy().copy()
            window = slice(max(prompt - 1, 0), len(tok) - 1)
            np.testing.assert_array_equal(mask[window], s["loss_mask"][1 if prompt == 0 else 0 :])
            mask[window] = 0
            assert not mask.any()
            seen.append(i)
    assert sorted(seen) == sorted(i for mb in microbatches for i in mb)


@settings(max_examples=60, deadline=None)
@given(
    sched=rank_schedules(),
    cp_size=st.sampled_from([1, 2, 4]),
    pad_multiple=st.sampled_from([2, 128]),
)
def test_masked_token_mean_matches_sample_by_sample(sched, cp_size, pad_multiple):
    """Masked token-mean of advantage × old log-prob: packed (any CP) equals sample by sample."""
    seed, n, microbatches = sched
    batch = random_batch(seed, n, 60)
    data = batch.tokens
    num, den, counted = 0.0, 0, 0
    for cp_rank in range(cp_size):
        it = MicrobatchIterator(
            batch,
            microbatches,
            step=0,
            dp_rank=0,
            pad_multiple=pad_multiple,
            cp_size=cp_size,
            cp_rank=cp_rank,
        )
        for mb in it:
            q = mb.advantages.double() * mb.old_logprobs.double()
            num += float((q * mb.loss_mask).sum())
            den += int(mb.loss_mask.sum())
            if cp_rank == 0:
                counted += mb.num_loss_tokens
    want_num, want_den = 0.0, 0
    for i in (i for mb in microbatches for i in mb):
        s = data.sample(i)
        prompt = int(data.total_lengths[i] - data.response_lengths[i])
        m = s["loss_mask"][1:] if prompt == 0 else s["loss_mask"]
        a = s["advantages"][len(s["advantages"]) - len(m) :]
        lp = s["old_logprobs"][len(s["old_logprobs"]) - len(m) :]
        want_num += float((a.astype(np.float64) * lp * m).sum())
        want_den += int(m.sum())
    assert den == want_den == counted
    assert num == pytest.approx(want_num, rel=1e-9, abs=1e-9)


def test_every_pass_yields_the_same_microbatches_packed_once():
    """Each iter() is a fresh pass (one per VPP chunk) over micro-batches packed only once."""
    batch = random_batch(5, 10, 30)
    it = MicrobatchIterator(batch, [[0, 3], [9], [1, 2, 4]], step=0, dp_rank=0, tp_size=2)
    first, second = list(it), list(it)
    assert len(it) == 3 and first[0].tokens.shape[1] % 256 == 0
    assert all(a is b for a, b in zip(first, second, strict=True))
    chunk_a, chunk_b = iter(it), iter(it)
    assert next(chunk_a) is next(chunk_b) is first[0]


def test_seq_length_is_the_longest_packed_microbatch_over_the_cp_group():
    """Lengths 5 and 3 (together) and 7: with cp=2 each pads to a multiple of 4 → 8+4 and 8;
    per CP rank 6 and 4 tokens, padded to a multiple of 4 → 8 and 4; times cp → 16."""
    data = RolloutTokens.from_samples(
        tokens=[np.arange(1, n + 1) for n in (5, 3, 7)],
        response_lengths=np.array([2, 1, 3]),
        loss_masks=[np.ones(r, bool) for r in (2, 1, 3)],
        rewards=np.zeros(3),
        group_ids=np.arange(3),
        advantages=[np.ones(r) for r in (2, 1, 3)],
    )
    batch = RolloutBatch.from_tokens(data)
    it = MicrobatchIterator(batch, [[0, 1], [2]], step=0, dp_rank=0, pad_multiple=4, cp_size=2)
    assert it.seq_length() == 16
    assert it.seq_length() == max(mb.tokens.shape[1] for mb in it) * 2
    flat = MicrobatchIterator(batch, [[0, 1], [2]], step=0, dp_rank=0, pad_multiple=1)
    assert flat.seq_length() == 8


def test_empty_microbatch_is_refused_with_its_place():
    """An empty micro-batch is named by step, DP rank and micro-batch index."""
    batch = random_batch(1, 6, 10)
    with pytest.raises(SlimeHydraError, match=r"step 8, DP rank 2: micro-batch 1 is empty"):
        MicrobatchIterator(batch, [[0, 1], [], [2]], step=8, dp_rank=2)


def test_out_of_range_index_is_refused_with_its_place():
    """A sample index outside the rollout is named with step, rank and micro-batch."""
    batch = random_batch(1, 6, 10)
    with pytest.raises(
        SlimeHydraError, match=r"step 1, DP rank 1: micro-batch 2 holds sample index 6"
    ):
        MicrobatchIterator(batch, [[0], [1], [2, 6]], step=1, dp_rank=1)
    with pytest.raises(SlimeHydraError, match="sample index -1"):
        MicrobatchIterator(batch, [[-1]], step=0, dp_rank=1)


def test_batch_without_tokens_is_refused():
    """A lengths-only RolloutBatch cannot be packed, and the error says which sources can."""
    batch = random_batch(1, 4, 10)
    lengths_only = RolloutBatch(batch.total_lengths, batch.response_lengths, batch.group_ids)
    with pytest.raises(SlimeHydraError, match="no token data"):
        MicrobatchIterator(lengths_only, [[0]], step=0, dp_rank=0)


def test_odd_pad_multiple_with_cp_is_refused():
    """With CP the padding must split into 2×cp chunks, so an odd pad_multiple is refused."""
    with pytest.raises(SlimeHydraError, match="must be even"):
        MicrobatchIterator(
            random_batch(1, 4, 10), [[0]], step=0, dp_rank=0, pad_multiple=3, cp_size=2
        )
