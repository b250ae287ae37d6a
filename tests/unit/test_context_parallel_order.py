"""The CP attention's reassembly: `sequence_chunks` finds every chunk of every sequence in the
CP all-gather, the inverse of the packer's zig-zag split."""

from __future__ import annotations

from itertools import pairwise

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime_hydra.data.packing import pack_microbatch
from slime_hydra.train.step.attention import sequence_chunks
from tests.rollouts import random_tokens


def test_two_sequences_over_two_ranks_by_hand() -> None:
    # Lengths 4 and 8, cp=2: chunks of 1 and 2 tokens. Rank 0 holds s0[0], s0[3], s1[0:2],
    # s1[6:8] (gathered rows 0-5); rank 1 holds s0[1:3], s1[2:6] (rows 6-11).
    s0, s1 = sequence_chunks(torch.arange(12), [1, 2], cp=2)
    assert [c.tolist() for c in s0] == [[0], [6], [7], [1]]
    assert [c.tolist() for c in s1] == [[2, 3], [8, 9], [10, 11], [4, 5]]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 6),
    cp=st.sampled_from([2, 3, 4]),
    pad_multiple=st.sampled_from([2, 8, 24]),
)
def test_the_chunks_at_those_rows_give_each_sequence_in_order(
    seed: int, n: int, cp: int, pad_multiple: int
) -> None:
    data = random_tokens(seed, n, 40)
    ranks = [
        pack_microbatch(data, range(n), pad_multiple=pad_multiple, cp_size=cp, cp_rank=r)
        for r in range(cp)
    ]
    cu = ranks[0].cu_seqlens.tolist()
    gathered = torch.cat([mb.position_ids[0] for mb in ranks])
    # cu_seqlens end with the padding sequence (if any): split with the others, not a sequence.
    chunks = [(end - start) // (2 * cp) for start, end in pairwise(cu)]
    found = sequence_chunks(gathered, chunks, cp)[:n]
    for (start, end), pieces in zip(pairwise(cu[: n + 1]), found, strict=True):
        assert torch.equal(torch.cat(pieces), torch.arange(end - start))
