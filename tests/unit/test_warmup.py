"""train/run/warmup.py: the micro-batch each rank warms up on."""

from __future__ import annotations

from slime_hydra.schedule import ParallelLayout, Schedule, StepSchedule
from slime_hydra.train.run.warmup import warmup_step

LENGTHS = (10, 50, 20, 35, 5, 40, 25)
STEPS = (
    StepSchedule.build(0, [[[0, 1]], [[2], [3]]]),  # rank 0: 60 tokens; rank 1: 20, 35
    StepSchedule.build(1, [[[4], [5]], [[6, 0]]]),  # rank 0: 5, 40; rank 1: 35 (25 + 10)
)


def test_each_rank_takes_its_own_largest_of_the_steps_left():
    schedule = Schedule(LENGTHS, None, STEPS)
    assert warmup_step(schedule, ParallelLayout(dp=2), 0).ranks == (((0, 1),), ((3,),))
    # Resumed after the first step: only the second is left.
    assert warmup_step(schedule, ParallelLayout(dp=2), 1).ranks == (((5,),), ((0, 6),))


def test_the_vpp_group_gets_a_whole_multiple():
    schedule = Schedule(LENGTHS[:2], None, (StepSchedule.build(0, [[[0], [1]]]),))
    layout = ParallelLayout(dp=1, pp=2, vpp=2, microbatch_group_size_per_vp_stage=3)
    assert layout.microbatch_alignment == 3
    assert warmup_step(schedule, layout, 0).ranks == (((1,), (1,), (1,)),)
