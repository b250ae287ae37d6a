"""The peers' documented contracts as our own hand cases, then as properties: every index once,
one count on every rank, a multiple of the VPP group, no part over the cap unless a single
sample, no empty part."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime_hydra.compat import slime, verl
from slime_hydra.compat.partitions import get_seqlen_balanced_partitions
from slime_hydra.errors import SlimeHydraError
from slime_hydra.partition.slime_kk import slime_first_fit_count

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sums(parts: list[list[int]], lengths: list[int]) -> list[int]:
    return [sum(lengths[i] for i in part) for part in parts]


def assert_sound(ranks: list[list[list[int]]], lengths: list[int], cap: int, align: int) -> None:
    """The contract of a cap-safe planner over DP ranks."""
    flat = sorted(i for rank in ranks for mb in rank for i in mb)
    assert flat == list(range(len(lengths))), "every index exactly once"
    counts = {len(rank) for rank in ranks}
    assert len(counts) == 1, f"one count on every rank, got {sorted(counts)}"
    assert counts.pop() % align == 0
    for rank in ranks:
        for mb in rank:
            assert mb, "no empty part"
            assert mb == sorted(mb)
            assert len(mb) == 1 or sum(lengths[i] for i in mb) <= cap


# get_seqlen_balanced_partitions: the shared call of slime and verl.


def test_both_peers_modules_offer_the_one_partition_call() -> None:
    assert slime.get_seqlen_balanced_partitions is verl.get_seqlen_balanced_partitions
    assert slime.get_seqlen_balanced_partitions is get_seqlen_balanced_partitions


def test_balanced_partitions_reach_a_perfect_split() -> None:
    # 1..6 sums to 21: three parts of 7 ({1,6}, {2,5}, {3,4}) are the only perfect split.
    lengths = [1, 2, 3, 4, 5, 6]
    parts = get_seqlen_balanced_partitions(lengths, 3, equal_size=False)
    assert len(parts) == 3 and sums(parts, lengths) == [7, 7, 7]
    assert sorted(i for p in parts for i in p) == list(range(6))
    assert all(p == sorted(p) for p in parts)


def test_equal_size_partitions_hold_n_over_k_each() -> None:
    # Two 10s must part; each takes two 1s: 12 and 12.
    lengths = [1, 10, 1, 1, 10, 1]
    parts = get_seqlen_balanced_partitions(lengths, 2, equal_size=True)
    assert [len(p) for p in parts] == [3, 3] and sums(parts, lengths) == [12, 12]
    assert [i for p in parts for i in p if lengths[i] == 10] in ([1, 4], [4, 1])


def test_zero_lengths_never_leave_a_part_empty() -> None:
    # The peers raise "the i-th partition is empty" where differencing stacks zeros together.
    lengths = [0, 0, 0, 10]
    parts = get_seqlen_balanced_partitions(lengths, 3, equal_size=False)
    assert all(parts) and sorted(i for p in parts for i in p) == [0, 1, 2, 3]
    assert max(sums(parts, lengths)) == 10


@pytest.mark.parametrize(
    ("lengths", "k", "equal", "message"),
    [
        ([1, 2], 3, False, "2 items cannot fill k_partitions=3"),
        ([1, 2], 0, False, "k_partitions=0"),
        ([1, 2, 3], 2, True, "multiple of k_partitions=2"),
    ],
)
def test_partition_preconditions_are_errors(
    lengths: list[int], k: int, equal: bool, message: str
) -> None:
    with pytest.raises(SlimeHydraError, match=message):
        get_seqlen_balanced_partitions(lengths, k, equal)


# verl: the count and the index lists of rearrange_micro_batches, cap-safe.


def test_verl_count_is_above_ceildiv_when_samples_do_not_split() -> None:
    # verl #7553's example: ⌈56/8⌉ = 7 parts put two 7s together (14 > 8); 8 parts are needed.
    assert verl.get_num_micro_batches([7] * 8, 8) == 8
    assert sorted(verl.plan_micro_batches([7] * 8, 8)) == [[i] for i in range(8)]


def test_verl_count_rounds_up_to_num_batches_divided_by() -> None:
    # ⌈16/8⌉ = 2, rounded up to 4: one sample each.
    assert verl.get_num_micro_batches([4, 4, 4, 4], 8, num_batches_divided_by=4) == 4
    assert verl.get_num_micro_batches([], 8) == 0


def test_verl_index_lists_fill_the_cap() -> None:
    lengths = [5, 3, 5, 3]
    parts = verl.plan_micro_batches(lengths, 8)
    assert sorted(sums(parts, lengths)) == [8, 8]
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3]


def test_verl_dp_group_gets_one_count_where_a_light_rank_would_have_too_few_samples() -> None:
    # Per rank, [8, 8, 8] needs 3 parts under 8 and [1] one: the DP MAX of 3 is more than the
    # light rank's one sample (verl asserts; EasyR1 #11012 deadlocks). The group plans 2 each.
    lengths = [8, 8, 8, 1]
    ranks = verl.plan_micro_batches(lengths, 8, dp_size=2)
    assert [len(rank) for rank in ranks] == [2, 2]
    assert_sound(ranks, lengths, 8, 1)


def test_verl_dp_group_splits_long_samples_evenly() -> None:
    # Four 6s need four parts under 8 (two 6s make 12): two per rank, a 1 beside a 6 on each.
    lengths = [6, 6, 6, 6, 1, 1]
    ranks = verl.plan_micro_batches(lengths, 8, dp_size=2)
    assert [sum(sums(rank, lengths)) for rank in ranks] == [13, 13]
    assert_sound(ranks, lengths, 8, 1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: verl.plan_micro_batches([9, 1], 8), "sample 0 has 9 tokens, over the cap of 8"),
        (lambda: verl.plan_micro_batches([1, 1], 8, dp_size=3), "cannot give each of 3 DP ranks"),
        (lambda: verl.plan_micro_batches([1], 0), "cap 0"),
        (lambda: verl.plan_micro_batches([1], 8, num_batches_divided_by=0), "divided_by=0"),
        # 9 sevens under 8 need 9 parts, 10 with a VPP group of 2: more parts than samples.
        (
            lambda: verl.plan_micro_batches([7] * 9, 8, num_batches_divided_by=2),
            "9 samples cannot fill 1 DP ranks",
        ),
    ],
)
def test_verl_errors_say_what_to_change(call, message: str) -> None:
    with pytest.raises(SlimeHydraError, match=message):
        call()


# slime: the first-fit count helper and one step's count and per-rank partitions.


def test_slime_count_is_at_most_first_fit() -> None:
    # First fit in order: {3, 3}, {7}, {7}: 3 bins; {3, 7} twice is 2.
    assert slime_first_fit_count([3, 3, 7, 7], 10) == 3
    assert slime.get_minimum_num_micro_batch_size([3, 3, 7, 7], 10) == 2


def test_slime_count_puts_an_oversize_sample_alone() -> None:
    # 12 over the cap alone, as slime's first fit puts it; 3 + 3 + 3 = 9 in one more.
    assert slime.get_minimum_num_micro_batch_size([12, 3, 3, 3], 10) == 2
    assert slime.get_minimum_num_micro_batch_size([], 10) == 0


def test_slime_rounds_the_vpp_count_up_not_down() -> None:
    # [6, 6, 6, 2] under 8: first fit needs 3 ({6, 2}, {6}, {6}); slime #1848 rounded 3 down
    # to the VPP group of 2, which puts two 6s in one part (12 > 8). Ours: 4 parts.
    count, partitions = slime.plan_micro_batches(
        [6, 6, 6, 2], 8, vpp_size=2, microbatch_group_size_per_vp_stage=2
    )
    assert count == 4
    assert sorted(partitions[0]) == [[0], [1], [2], [3]]


def test_slime_cap_is_max_tokens_per_gpu_times_cp_and_ranks_share_a_count() -> None:
    # cap 5 × 2 = 10 over 2 ranks, 28 tokens: ⌈28/10/2⌉ = 2 per rank, each part a 5 and a 2.
    lengths = [5, 5, 5, 5, 2, 2, 2, 2]
    count, partitions = slime.plan_micro_batches(
        lengths, 5, cp_size=2, dp_size=2, vpp_size=2, microbatch_group_size_per_vp_stage=2
    )
    assert count == 2
    assert [sums(rank, lengths) for rank in partitions] == [[7, 7], [7, 7]]
    assert_sound(partitions, lengths, 10, 2)


def test_slime_vpp_needs_its_group_size() -> None:
    with pytest.raises(SlimeHydraError, match="needs microbatch_group_size_per_vp_stage"):
        slime.plan_micro_batches([1, 2, 3, 4], 8, vpp_size=2)


# The same contracts as properties over random steps.


@st.composite
def steps(draw: st.DrawFn, oversize: bool) -> tuple[list[int], int, int, int]:
    """(lengths, cap, dp, VPP group) with enough samples for dp × group non-empty parts and
    a mix of short, long and (if `oversize`) over-cap samples."""
    cap = draw(st.integers(8, 4096))
    dp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    align = draw(st.sampled_from([1, 1, 2, 3, 4]))
    n = draw(st.integers(2 * dp * align, 2 * dp * align + 96))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    top = cap + cap // 2 if oversize else cap
    lengths = [
        rng.choice((rng.randint(1, cap // 8), rng.randint(1, top), rng.randint(cap // 2, top)))
        for _ in range(n)
    ]
    return lengths, cap, dp, align


@PROPERTY
@given(steps(oversize=True))
def test_slime_plans_are_sound(case: tuple[list[int], int, int, int]) -> None:
    lengths, cap, dp, align = case
    try:
        count, partitions = slime.plan_micro_batches(
            lengths, cap, dp_size=dp, vpp_size=2, microbatch_group_size_per_vp_stage=align
        )
    except SlimeHydraError as exc:
        assert "cannot fill" in str(exc)  # more parts needed than samples: said, not planned
        return
    assert all(len(rank) == count for rank in partitions)
    assert_sound(partitions, lengths, cap, align)


@PROPERTY
@given(steps(oversize=False))
def test_verl_plans_are_sound(case: tuple[list[int], int, int, int]) -> None:
    lengths, cap, dp, align = case
    try:
        ranks = verl.plan_micro_batches(lengths, cap, dp, align)
    except SlimeHydraError as exc:
        assert "cannot fill" in str(exc)
        return
    assert_sound(ranks, lengths, cap, align)
    if dp == 1:
        assert verl.plan_micro_batches(lengths, cap, None, align) == ranks[0]


@PROPERTY
@given(steps(oversize=True))
def test_slime_count_lies_between_the_token_bound_and_first_fit(
    case: tuple[list[int], int, int, int],
) -> None:
    lengths, cap, _, _ = case
    count = slime.get_minimum_num_micro_batch_size(lengths, cap)
    over = [n for n in lengths if n > cap]
    fitting = sum(n for n in lengths if n <= cap)
    assert len(over) + -(-fitting // cap) <= count <= slime_first_fit_count(lengths, cap)


@PROPERTY
@given(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=200),
    st.integers(1, 16),
    st.booleans(),
)
def test_balanced_partitions_keep_the_contract(lengths: list[int], k: int, equal: bool) -> None:
    n = len(lengths)
    if n < k or (equal and n % k):
        with pytest.raises(SlimeHydraError):
            get_seqlen_balanced_partitions(lengths, k, equal)
        return
    parts = get_seqlen_balanced_partitions(lengths, k, equal)
    assert len(parts) == k and all(parts) and all(p == sorted(p) for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(n))
    if equal:
        assert {len(p) for p in parts} == {n // k}


# slime since #1926: build_dp_schedule, the rollout manager's whole-rollout call.


def dynamic_args(max_tokens_per_gpu: int | None = 8) -> SimpleNamespace:
    return SimpleNamespace(
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=max_tokens_per_gpu,
        micro_batch_size=1,
        balance_data=False,
        balance_by_flops=False,
    )


def parallel(dp: int = 2, cp: int = 1, vpp: int = 1, group: int = 1) -> dict[str, int]:
    return {
        "dp_size": dp,
        "cp_size": cp,
        "vpp_size": vpp,
        "microbatch_group_size_per_vp_stage": group,
    }


def test_build_dp_schedule_keeps_slime_s_shape_and_drops_the_trailing_rollout() -> None:
    # Rollouts 0..4 (two samples each for 0-2), two per step: steps {0, 1} and {2, 3}; rollout
    # 4 fills no step. Step 1: four 4s under 8 → one {4, 4} per rank. Step 2: the 9 over the
    # cap alone, {2, 2} beside it on the other rank.
    lengths = [4, 4, 4, 4, 2, 2, 9, 3]
    rollouts = [0, 0, 1, 1, 2, 2, 3, 4]
    partitions, indices, counts, sizes = slime.build_dp_schedule(
        dynamic_args(), parallel(), lengths, global_batch_size=2, rollout_indices=rollouts
    )
    assert counts == [1, 1] and sizes == [2, 2]
    assert sorted(i for p in partitions for i in p) == [0, 1, 2, 3, 4, 5, 6]
    for partition, mbs in zip(partitions, indices, strict=True):
        assert [i for mb in mbs for i in mb] == list(range(len(partition)))
        assert len(mbs) == sum(counts)
        assert {partition[i] for i in mbs[0]} <= {0, 1, 2, 3}  # step 1 first
    tokens = sorted(
        tuple(sum(lengths[partition[i]] for i in mb) for mb in mbs)
        for partition, mbs in zip(partitions, indices, strict=True)
    )
    assert tokens == [(8, 4), (8, 9)]


def test_build_dp_schedule_rounds_each_step_to_the_vpp_group() -> None:
    # One step of [6, 6, 6, 2] on one rank under 8 with a VPP group of 2: 3 bins → 4.
    _, indices, counts, _ = slime.build_dp_schedule(
        dynamic_args(),
        parallel(dp=1, vpp=2, group=2),
        [6, 6, 6, 2],
        global_batch_size=4,
        rollout_indices=[0, 1, 2, 3],
    )
    assert counts == [4] and indices == [[[0], [1], [2], [3]]]


@pytest.mark.parametrize(
    ("args", "rollouts", "message"),
    [
        (dynamic_args(None), [0, 1], "dynamic batching only"),
        (SimpleNamespace(use_dynamic_batch_size=False, max_tokens_per_gpu=8), [0, 1], "only"),
        (dynamic_args(), [0, 0], "1 rollouts fill no step of global_batch_size=2"),
    ],
)
def test_build_dp_schedule_errors(args: SimpleNamespace, rollouts: list[int], message: str) -> None:
    with pytest.raises(SlimeHydraError, match=message):
        slime.build_dp_schedule(
            args, parallel(), [1, 1], global_batch_size=2, rollout_indices=rollouts
        )


@PROPERTY
@given(steps(oversize=True), st.integers(1, 4), st.integers(1, 3))
def test_build_dp_schedule_keeps_slime_s_invariants(
    case: tuple[list[int], int, int, int], per_rollout: int, steps_wanted: int
) -> None:
    """slime's documented invariants: one count per step on every rank, each rank's positions
    tiled once by its micro-batches, every kept sample on one rank, no part over the cap unless
    alone; and ours: rollouts whole, the trailing ones dropped."""
    lengths, cap, dp, align = case
    rollouts = [i // per_rollout for i in range(len(lengths))]
    num_rollouts = rollouts[-1] + 1
    gbs = max(1, num_rollouts // steps_wanted)
    kept = {i for i, r in enumerate(rollouts) if r < num_rollouts // gbs * gbs}
    try:
        partitions, indices, counts, sizes = slime.build_dp_schedule(
            dynamic_args(cap),
            parallel(dp=dp, vpp=2, group=align),
            lengths,
            global_batch_size=gbs,
            rollout_indices=rollouts,
        )
    except SlimeHydraError as exc:
        assert "cannot" in str(exc)  # a step too small for dp × group parts: said
        return
    assert sizes == [gbs] * len(counts) and all(c % align == 0 for c in counts)
    assert sorted(i for p in partitions for i in p) == sorted(kept)
    for partition, mbs in zip(partitions, indices, strict=True):
        assert [i for mb in mbs for i in mb] == list(range(len(partition)))
        assert len(mbs) == sum(counts)
        for mb in mbs:
            assert mb and (len(mb) == 1 or sum(lengths[partition[i]] for i in mb) <= cap)
