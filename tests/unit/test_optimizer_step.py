"""The GPU optimizer's step and checkpoint state (train/step/optimizer.py) with megatron-core's own
Float16Optimizer, ChainedOptimizer and DynamicGradScaler on the CPU: under fp16 the loss scale
must come down from 2**32 until the fp16 gradients fit, then the update applies; without a
scaler (bf16), a non-finite gradient is never handed to the optimizer; a checkpoint asks the
distributed optimizer for no state."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from slime_hydra.train.step import cpu_shim
from slime_hydra.train.step.engine import StepResult, loss_scale_overflow
from slime_hydra.train.step.optimizer import checkpoint_state, grad_scaler, optimizer_step
from tests.single_rank import single_rank

FP16_MAX = 65504.0


@pytest.fixture(autouse=True)
def megatron_on_cpu(monkeypatch: pytest.MonkeyPatch):
    """megatron's optimizer, grad scaler and grad-norm code place their flags, scales and norms
    on CUDA: map those placements to the CPU (the CPU trainer's shim, on these modules), in
    one rank's groups."""
    for name in (
        "megatron.core.optimizer.optimizer",
        "megatron.core.optimizer.grad_scaler",
        "megatron.core.optimizer.clip_grads",
        "megatron.core.utils",
    ):
        monkeypatch.setattr(importlib.import_module(name), "torch", cpu_shim._CpuTorch())
    with single_rank():
        yield


def megatron_optimizer(param: torch.nn.Parameter, fp16: bool):
    """megatron's ChainedOptimizer over one Float16Optimizer, as get_megatron_optimizer builds
    it, with megatron's fp16 defaults (initial scale 2**32, hysteresis 2, min scale 1)."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler
    from megatron.core.optimizer.optimizer import (
        ChainedOptimizer,
        Float16OptimizerWithFloat16Params,
        MixedPrecisionOptimizer,
    )

    config = OptimizerConfig(
        optimizer="adam",
        lr=0.1,
        clip_grad=0.0,
        fp16=fp16,
        bf16=not fp16,
        params_dtype=param.dtype,
    )
    scaler = (
        DynamicGradScaler(
            config.initial_loss_scale,
            config.min_loss_scale,
            2.0,
            0.5,
            config.loss_scale_window,
            config.hysteresis,
        )
        if fp16
        else None
    )

    class CpuFloat16Optimizer(Float16OptimizerWithFloat16Params):
        """megatron's class; only its constructor's check that parameters are CUDA tensors
        is left out (the fp32 main copy is made the same way)."""

        def __init__(self) -> None:
            inner = torch.optim.AdamW([param], lr=config.lr)
            MixedPrecisionOptimizer.__init__(self, inner, config, scaler, None)
            self.is_stub_optimizer = False
            main = param.detach().clone().float()
            param.main_param = main
            inner.param_groups[0]["params"] = [main]
            self.float16_groups = [[param]]
            self.fp32_from_float16_groups = [[main]]
            self.fp32_from_fp32_groups = [[]]

    return ChainedOptimizer([CpuFloat16Optimizer()])


def finite(param: torch.nn.Parameter):
    return lambda: bool(torch.isfinite(param.main_grad).all())


def test_fp16_lowers_the_loss_scale_until_the_gradients_fit_then_updates():
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    optimizer = megatron_optimizer(param, fp16=True)
    assert grad_scaler(optimizer) is not None
    outcomes, scales = [], []
    for _ in range(19):
        scale = float(optimizer.get_loss_scale())
        # A true gradient of 1.0, scaled by the loss scale in an fp16 backward: inf above 65504.
        param.main_grad = (torch.ones(4) * scale).half().float()
        outcomes.append(optimizer_step(optimizer, finite(param))[0])
        scales.append(scale)
    # By hand: hysteresis 2 keeps 2**32 for one more overflow, then each overflow halves it:
    # steps 1-18 overflow (scales 2**32, 2**32, 2**31, ..., 2**16 = 65536 > 65504), and step 19
    # runs at 2**15 = 32768, where the gradient fits and the update applies.
    assert scales == [2.0**32, 2.0**32, *(2.0**e for e in range(31, 14, -1))]
    assert outcomes == [False] * 18 + [True]
    assert float(param.detach()[0]) < 1.0  # AdamW moved the weight against the gradient
    assert float(optimizer.get_loss_scale()) == 2.0**15


def test_without_a_loss_scaler_a_non_finite_gradient_never_reaches_the_optimizer():
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    optimizer = megatron_optimizer(param, fp16=False)
    assert grad_scaler(optimizer) is None
    param.main_grad = torch.tensor([1.0, float("inf"), 1.0, 1.0])
    assert optimizer_step(optimizer, finite(param)) == (False, None)
    assert param.tolist() == [1.0] * 4
    param.main_grad = torch.ones(4)
    assert optimizer_step(optimizer, finite(param))[0] is True
    assert float(param.detach()[0]) < 1.0


def test_an_overflow_counts_as_loss_scaling_only_while_the_scale_can_come_down():
    from megatron.core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler

    dynamic = DynamicGradScaler(2.0**32, 1.0, 2.0, 0.5, 1000, 2)
    assert loss_scale_overflow(dynamic, 2.0**32, updated=False, loss=0.5)
    assert not loss_scale_overflow(dynamic, 2.0**32, updated=True, loss=0.5)
    assert not loss_scale_overflow(dynamic, 1.0, updated=False, loss=0.5)  # at min_scale
    assert not loss_scale_overflow(dynamic, 2.0**32, updated=False, loss=math.nan)
    assert not loss_scale_overflow(ConstantGradScaler(1024.0), 1024.0, updated=False, loss=0.5)
    assert not loss_scale_overflow(None, None, updated=False, loss=0.5)


def test_the_loss_scale_is_a_metric_under_fp16_only():
    base = dict(loss=0.5, grad_norm=1.0, lr=1e-6, clipfrac=0.0, approx_kl=0.0)
    assert StepResult(**base, loss_scale=32768.0).metrics()["train/loss_scale"] == 32768.0
    assert "train/loss_scale" not in StepResult(**base).metrics()


def test_a_checkpoint_keeps_the_optimizer_state_but_none_of_the_distributed_optimizer():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    param = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    optimizer = megatron_optimizer(param, fp16=True)
    state = checkpoint_state(optimizer)
    assert state["grad_scaler"]["scale"].item() == 2.0**32
    assert state.keys() == optimizer.state_dict().keys()
    # Its state_dict() would assert one common Adam step, which fails before any applied step;
    # an instance never built shows that it is not called at all.
    unbuilt = object.__new__(DistributedOptimizer)
    assert checkpoint_state(ChainedOptimizer([unbuilt])) == {}
