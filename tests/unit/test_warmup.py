"""train/run/warmup.py: the micro-batch each rank warms up on."""

from __future__ import annotations

from slime_hydra.schedule import ParallelLayout, Schedule, StepSchedule
from slime_hydra.train.run.warmup import warmup_step

LENGTHS = (10, 50, 20, 35, 5, 40, 25, 70, 15, 30)
STEPS = (
    StepSchedule.build(0, [[[0, 1]], [[2], [3]]]),  # rank 0: 60 tokens; rank 1: 20, 35
    StepSchedule.build(1, [[[4], [5]], [[6, 9]]]),  # rank 0: 5, 40; rank 1: 55 (25 + 30)
    StepSchedule.build(2, [[[7]], [[8]]]),  # rank 0: 70; rank 1: 15
)


def test_each_rank_takes_its_own_largest_of_the_steps_it_trains():
    schedule = Schedule(LENGTHS, None, STEPS)
    layout = ParallelLayout(dp=2)
    assert warmup_step(schedule, layout, 0, 3).ranks == (((7,),), ((6, 9),))
    # Resumed after the first step: the steps left.
    assert warmup_step(schedule, layout, 1, 3).ranks == (((7,),), ((6, 9),))
    # trainer.max_steps=2: the third step does not run, so rank 0 warms up on 60, not 70.
    assert warmup_step(schedule, layout, 0, 2).ranks == (((0, 1),), ((6, 9),))
    assert warmup_step(schedule, layout, 0, 1).ranks == (((0, 1),), ((3,),))


def test_the_vpp_group_gets_a_whole_multiple():
    schedule = Schedule(LENGTHS[:2], None, (StepSchedule.build(0, [[[0], [1]]]),))
    layout = ParallelLayout(dp=1, pp=2, vpp=2, microbatch_group_size_per_vp_stage=3)
    assert layout.microbatch_alignment == 3
    assert warmup_step(schedule, layout, 0, 1).ranks == (((1,), (1,), (1,)),)
