"""Every micro-batch count the planner produces for an interleaved (VPP) layout passes
megatron-core 0.16's own checks and schedule table (pipeline_parallel/schedules.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.pipeline_parallel.schedules import get_schedule_table

from slime_hydra.schedule import DynamicBatching, ParallelLayout


@st.composite
def vpp_layouts(draw: st.DrawFn) -> tuple[ParallelLayout, int]:
    """An interleaved layout (g from pp to 2·pp+1) and a token cap, near and far from tight."""
    pp = draw(st.integers(2, 4))
    layout = ParallelLayout(
        dp=draw(st.sampled_from([1, 2, 4])),
        pp=pp,
        vpp=draw(st.integers(2, 3)),
        cp=draw(st.sampled_from([1, 2])),
        microbatch_group_size_per_vp_stage=draw(st.integers(pp, 2 * pp + 1)),
    )
    return layout, draw(st.sampled_from([512, 1024, 4096]))


@settings(max_examples=150, deadline=None)
@given(case=vpp_layouts(), seed=st.integers(0, 10_000), steps=st.integers(1, 3))
def test_planned_counts_pass_megatrons_interleaving_checks(case, seed, steps) -> None:
    layout, cap = case
    rng = np.random.default_rng(seed)
    # Samples per rank a multiple of g: every aligned count up to one sample per micro-batch fits.
    gbs = layout.dp * layout.vp_group_size * int(rng.integers(1, 5))
    lengths = rng.integers(16, cap * layout.cp + 1, gbs * steps)
    strategy = DynamicBatching(layout, gbs, max_tokens_per_gpu=cap)
    schedule = strategy.plan(lengths, np.arange(len(lengths)))
    pp, g, vpp = layout.pp, layout.vp_group_size, layout.vpp
    for step in schedule.steps:
        m = step.num_microbatches
        # forward_backward_pipelining_with_interleaving, megatron-core 0.16.1 lines ~996-1016.
        assert pp <= g <= m
        assert m % g == 0 or m % g >= pp
        table = get_schedule_table(m, vpp, g)
        assert sorted(table) == [(mb, chunk) for mb in range(m) for chunk in range(vpp)]
