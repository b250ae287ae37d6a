"""The pipeline cost model on hand-computed cases."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from slime_hydra.schedule.pipeline import Exchange, simulate_pipelines, stage_calls, stage_order


def makespan(
    forward_s: Sequence[float], pp: int, vpp: int = 1, group: int | None = None, p2p_s: float = 0.0
) -> float:
    """One pipeline's step time."""
    return float(simulate_pipelines(np.array([forward_s], dtype=float), pp, vpp, group, p2p_s)[0])


def bubble(forward_s: Sequence[float], pp: int, vpp: int = 1, group: int | None = None) -> float:
    """The stages' idle share: each is busy 3·Σforward / pp (backward twice the forward)."""
    return 1 - 3 * sum(forward_s) / pp / makespan(forward_s, pp, vpp, group)


@pytest.mark.parametrize(("pp", "m"), [(1, 4), (2, 4), (2, 8), (4, 8), (4, 16)])
def test_equal_micro_batches_give_the_textbook_1f1b_bubble(pp, m):
    assert bubble([1.0] * m, pp) == pytest.approx((pp - 1) / (m + pp - 1))
    # (m + p - 1) slots of forward + backward of one stage's share: (1 + 2) / p each.
    assert makespan([1.0] * m, pp) == pytest.approx((m + pp - 1) * 3 / pp)


def test_a_two_stage_pipeline_by_hand():
    # p=2, m=2, f=1 per stage-chunk (whole-model forward 2): stage 0 runs F0 F1 B0 B1 with B0
    # waiting for stage 1: F0[0,1] F1[1,2] | stage 1: F0[1,2] B0[2,4] F1[4,5] B1[5,7];
    # stage 0: B0[4,6] B1[7,9]. Makespan 9, busy 6 per stage.
    assert makespan([2.0, 2.0], pp=2) == pytest.approx(9.0)


def test_interleaving_shrinks_the_bubble():
    assert bubble([1.0] * 8, pp=4, vpp=2, group=4) < bubble([1.0] * 8, pp=4)


def test_one_long_micro_batch_stalls_every_stage():
    assert makespan([0.5] * 4 + [1.5] * 4, pp=4) > makespan([1.0] * 8, pp=4)


def test_stage_order_runs_every_op_once_in_megatron_order():
    ops = stage_order(stage=0, pp=2, vpp=2, group=2, num_mb=4)
    assert sorted(ops) == sorted([(k, c, m) for k in "FB" for c in range(2) for m in range(4)])
    # warm-up on stage 0: (p - 1) * 2 + (v - 1) * g = 4 forwards: chunk 0 then chunk 1 of mb 0-1
    assert ops[:4] == [("F", 0, 0), ("F", 0, 1), ("F", 1, 0), ("F", 1, 1)]
    assert ops[4:6] == [("F", 0, 2), ("B", 1, 0)]


def test_a_partial_virtual_pipeline_group_is_refused():
    # megatron's first stage receives chunk inputs pp - 1 steps after the last stage sent them,
    # which holds for whole groups only: 3 micro-batches in groups of 2 would hang.
    with pytest.raises(ValueError, match="whole groups of 2"):
        makespan([1.0] * 3, pp=2, vpp=2, group=2)


def test_interleaved_calls_are_megatrons_by_hand():
    # pp=2, vpp=2, group=2, 2 micro-batches: virtual micro-batches (mb, chunk) (0,0) (1,0) (0,1)
    # (1,1). Stage 0 warms up through all 4 (warm-up (2-0-1)·2 + 2 = 4), receiving chunk 1's
    # inputs at k=1 and 2 (one step after stage 1 sent them), then runs the 4 backwards.
    f, b = "F", "B"
    assert stage_calls(0, 2, 2, 2, 2) == [
        (f, 0, 0), Exchange(send_next=True),
        (f, 0, 1), Exchange(send_next=True, recv_prev=True),
        (f, 1, 0), Exchange(send_next=True, recv_prev=True),
        (f, 1, 1), Exchange(send_next=True),
        Exchange(recv_next=True),
        (b, 1, 0), Exchange(send_prev=True, recv_next=True),
        (b, 1, 1), Exchange(send_prev=True, recv_next=True),
        (b, 0, 0), Exchange(recv_next=True),
        (b, 0, 1),
    ]  # fmt: skip
    # Stage 1 (last): warm-up 2, then two steady steps, each a forward with its exchange and a
    # backward with its own (the engine overlaps p2p); its chunk-1 outputs are the loss (no
    # send, so the last forward has no exchange), its first backward input is its own loss.
    assert stage_calls(1, 2, 2, 2, 2) == [
        Exchange(recv_prev=True),
        (f, 0, 0), Exchange(send_next=True, recv_prev=True),
        (f, 0, 1), Exchange(send_next=True, recv_prev=True),
        (f, 1, 0), Exchange(recv_prev=True),
        (b, 1, 0), Exchange(send_prev=True),
        (f, 1, 1),
        (b, 1, 1), Exchange(send_prev=True, recv_next=True),
        (b, 0, 0), Exchange(send_prev=True, recv_next=True),
        (b, 0, 1), Exchange(send_prev=True),
    ]  # fmt: skip


def test_a_stage_waits_at_its_exchange_for_both_inputs():
    # pp=2, vpp=2, group=3, stage-chunk forwards 1, 1, 2 (backwards 2, 2, 4), traced by hand:
    # stage 1 finishes B(0, 0) at 21 and exchanges (send that gradient, receive the next
    # one) with stage 0, which reaches its exchange only after B(1, 2) at 23; stage 0's last
    # backward runs 29-33. Ops that waited only for their own input would end at 30.
    assert makespan([4.0, 4.0, 8.0], pp=2, vpp=2, group=3) == pytest.approx(33.0)


def test_an_exchange_waits_for_its_peer():
    # The case above with whole-model forwards 4 and 2 (a stage-chunk forward 1 and 0.5):
    # stage 1 ends its second steady step at 7.5 but its exchange returns only when stage 0,
    # busy with B(1, 0) until 8, reaches its own; the step ends at 13 with 9 busy per stage.
    assert makespan([4.0, 2.0], pp=2, vpp=2, group=2) == pytest.approx(13.0)
    # Each exchange costs p2p_s once, however many transfers it carries.
    assert makespan([4.0, 2.0], pp=2, vpp=2, group=2, p2p_s=0.25) > 13.0
