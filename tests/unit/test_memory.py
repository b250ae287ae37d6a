"""The memory model (schedule/memory.py) and plan mode's sim/peak_memory_gib, by hand.

A toy model keeps the arithmetic short: l = 4 layers, h = 8, n = 2 heads of d = 4, g = 1 query
group, f = 16 (SwiGLU: k = 3), V = 32, RMSNorm, no QKV bias, untied output layer.
  activations per token per layer, tp = 1: 2·(4h + 2nd + 2gd + 3f) = 2·(32 + 16 + 8 + 48) = 208
  logits per token on the last stage, tp = 1: 4·V = 128
  params per layer: QKV h·(nd + 2gd) = 128, output nd·h = 64, MLP 3·h·f = 384, norms 2h = 16
  (592); embedding and output layer V·h = 256 each; final norm h = 8.
"""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from slime_hydra.schedule import ParallelLayout, Schedule, StepSchedule
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.schedule.memory import GIB, MemoryModel
from slime_hydra.schedule.steptime import StepCost
from slime_hydra.train.job import plan_steps
from slime_hydra.train.run.plan import memory_penalty, simulate
from slime_hydra.train.settings import PlanTrainer

TOY = ModelDims(
    name="toy",
    num_layers=4,
    hidden_size=8,
    ffn_hidden_size=16,
    num_attention_heads=2,
    num_query_groups=1,
    vocab_size=32,
    max_position_embeddings=64,
)
TOKENS = [10, 20, 30]  # one DP rank's micro-batches, in megatron's order


def model(distributed_optimizer: bool = False, **layout: int | bool) -> MemoryModel:
    return MemoryModel(TOY, ParallelLayout(**layout), distributed_optimizer)


def test_activation_and_logit_bytes_per_token():
    assert model().activation_bytes_per_token_layer == 208
    assert model().logits_bytes_per_token == 128


def test_tensor_parallel_halves_activations_with_sequence_parallelism():
    # tp=2 with sequence parallelism: every term over 2, 208 / 2 = 104; without it the 4h norm
    # and linear inputs stay whole: 2·(32 + 72/2) = 136. The logits are vocab-parallel: 64.
    assert model(tp=2, sequence_parallel=True).activation_bytes_per_token_layer == 104
    assert model(tp=2).activation_bytes_per_token_layer == 136
    assert model(tp=2).logits_bytes_per_token == 64


def test_parameters_per_stage():
    # pp=1: 4·592 + embedding 256 + final norm 8 + output layer 256 = 2888.
    assert model().stage_params(0) == 2888
    # Tied embeddings share the output layer on one stage ...
    tied = dataclasses.replace(TOY, untie_embeddings_and_output_weights=False)
    assert MemoryModel(tied, ParallelLayout()).stage_params(0) == 2888 - 256
    # ... and with pp=2 the last stage holds its own copy: 2·592 + 8 + 256 = 1448.
    assert MemoryModel(tied, ParallelLayout(pp=2)).stage_params(1) == 1448
    # pp=2 untied: stage 0 has 2 layers and the embedding (1440), stage 1 2 layers, final norm
    # and output layer (1448).
    assert model(pp=2).stage_params(0) == 2 * 592 + 256
    assert model(pp=2).stage_params(1) == 2 * 592 + 8 + 256
    # tp=2 splits the matrices, not the norms: 4·(576/2 + 16) + 256/2 + 8 + 256/2 = 1480.
    assert model(tp=2).stage_params(0) == 1480


def test_bytes_per_param_with_and_without_the_distributed_optimizer():
    assert model().bytes_per_param == 18
    # 6 bytes stay on every GPU; 12 are sharded over dp × cp = 2 × 2 ranks: 6 + 3.
    assert model(True, dp=2, cp=2).bytes_per_param == 9
    assert model(False, dp=2, cp=2).bytes_per_param == 18


def test_no_pipelining_holds_one_microbatch():
    # pp=1: F0 B0 F1 B1 F2 B2, the largest micro-batch alone: 30 × (4·208 + 128) = 28800.
    assert model().stage_activation_peak(0, TOKENS) == 30 * (4 * 208 + 128)
    # Peak: 2888 params × 18 bytes + 28800.
    assert model().peak_bytes(TOKENS) == 2888 * 18 + 28800


def test_1f1b_stage_s_holds_pp_minus_s_microbatches():
    # pp=2, 2 layers per stage (416 bytes per token). Stage 0: F0 F1 B0 F2 B1 B2 holds two
    # micro-batches at once, at most 20 + 30 = 50 tokens: 50 × 416 = 20800.
    assert model(pp=2).stage_activation_peak(0, TOKENS) == 50 * 416
    # Stage 1: F0 B0 F1 B1 F2 B2, one at a time, with the logits: 30 × (416 + 128) = 16320.
    assert model(pp=2).stage_activation_peak(1, TOKENS) == 30 * (416 + 128)
    # The fuller GPU: stage 0, 1440 × 18 + 20800 = 46720 (stage 1: 1448 × 18 + 16320 = 42384).
    assert model(pp=2).peak_bytes(TOKENS) == 46720


def test_two_microbatches_by_hand():
    # pp=2, micro-batches of 10 and 20 tokens. Stage 0: F0 (10) F1 (30) B0 B1: 30 × 416.
    # Stage 1: F0 B0 F1 B1: 20 × (416 + 128). cp=2 halves the tokens on each GPU.
    assert model(pp=2).stage_activation_peak(0, [10, 20]) == 30 * 416
    assert model(pp=2).stage_activation_peak(1, [10, 20]) == 20 * 544
    assert model(pp=2, cp=2).stage_activation_peak(0, [10, 20]) == 15 * 416


def test_interleaved_holds_its_warmup_plus_one_chunk():
    # pp=2, vpp=2, groups of 2, micro-batches of 1, 2, 3, 4 tokens; 1 layer per chunk (208).
    # Stage 0 warms up with (2-0-1)·2 + (2-1)·2 = 4 forwards: c0m0 c0m1 c1m0 c1m1 (6 tokens),
    # then F c0m2 (9) B c1m0 (8) F c0m3 (12) B c1m1 (10) F c1m2 (13) B c0m0 (12) F c1m3 (16):
    # 5 chunk-micro-batches in flight, c0m1 c0m2 c0m3 c1m2 c1m3 = 2 + 3 + 4 + 3 + 4 = 16 tokens.
    layout = {"pp": 2, "vpp": 2, "microbatch_group_size_per_vp_stage": 2}
    assert model(**layout).stage_activation_peak(0, [1, 2, 3, 4]) == 16 * 208


def test_plan_mode_logs_the_peak_of_the_fullest_rank():
    # dp=2: rank 0 runs micro-batches of 10, 20 and 30 tokens, rank 1 one of 5; pp=1. Rank 0's
    # peak is the pp=1 case above, 2888 × 18 + 28800 = 80784 bytes.
    step = StepSchedule.build(0, [[[0], [1], [2]], [[3]]])
    schedule = Schedule((10, 20, 30, 5), None, (step,))
    cost = StepCost(token_s=1.0, square_s=0.0, microbatch_s=0.0)
    layout = ParallelLayout(dp=2)
    planned = plan_steps(schedule, layout, TOY, cost)
    job = SimpleNamespace(layout=layout, schedule=schedule, cost=cost, dims=TOY, planned=planned)
    sim = simulate(PlanTrainer(), job, step)
    assert sim["sim/peak_memory_gib"] == pytest.approx(80784 / GIB)
    # The distributed optimizer shards 12 of the 18 bytes over dp=2: 2888 × 12 fewer bytes.
    sharded = simulate(PlanTrainer(use_distributed_optimizer=True), job, step)
    assert sharded["sim/peak_memory_gib"] == pytest.approx((80784 - 2888 * 6) / GIB)


def test_a_step_over_the_memory_limit_makes_the_objective_infinite(caplog):
    trainer = PlanTrainer(memory_limit_gib=80.0)
    assert memory_penalty(trainer, 1, 79.9) == 0.0
    assert memory_penalty(trainer, 1, 80.1) == math.inf
    assert "trainer.memory_limit_gib=80.0" in caplog.text
    assert memory_penalty(PlanTrainer(memory_limit_gib=None), 1, 1e6) == 0.0
