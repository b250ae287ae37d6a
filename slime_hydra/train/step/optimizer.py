"""The optimizer step, the same in meaning on both devices: AdamW at a constant lr, weight decay
scaled by megatron's `wd_mult` (0 for biases and 1-D parameters), the global gradient norm
(TP shards summed, tied and replicated weights once) clipped to `clip_grad`.

GPU: megatron's own optimizer (`get_megatron_optimizer`, optionally distributed). CPU: torch's
AdamW over megatron DDP's `main_grad` buffers (`MainGradAdamW`): megatron's optimizer has CUDA
placements in three more modules (optimizer, clip_grads, grad_scaler) that a CPU shim would
have to map, for a path (fp32 without loss scaling) that is plain AdamW anyway. On both devices
megatron's `OptimizerParamScheduler` sets lr and weight decay × wd_mult in every param group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared


@dataclass(frozen=True)
class OptimizerSettings:
    """What trainer.* says about the optimizer."""

    lr: float
    weight_decay: float
    clip_grad: float
    """Clip the global gradient norm to this; 0 disables clipping."""


def no_weight_decay(name: str, param: torch.Tensor) -> bool:
    """megatron's rule (`get_standard_config_overrides`): biases and 1-D params get wd_mult 0."""
    return name.endswith(".bias") or param.dim() == 1


class MainGradAdamW:
    """torch AdamW over megatron DDP's fp32 `main_grad`, with megatron's optimizer contract:
    `step()` returns (update applied, global grad norm, None)."""

    def __init__(self, chunks: list[torch.nn.Module], settings: OptimizerSettings) -> None:
        named = [(n, p) for c in chunks for n, p in c.named_parameters() if p.requires_grad]
        self.params = [p for _, p in named]
        groups = [
            {"params": [p for n, p in named if no_weight_decay(n, p) == skip], "wd_mult": mult}
            for skip, mult in ((False, 1.0), (True, 0.0))
        ]
        self.optimizer = torch.optim.AdamW(
            [g for g in groups if g["params"]], lr=settings.lr, weight_decay=settings.weight_decay
        )
        self.clip_grad = settings.clip_grad

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self) -> None:
        """Drop the `.grad` views; DDP's `zero_grad_buffer` clears `main_grad` itself."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> tuple[bool, float, None]:
        """Clip and apply the reduced gradients (the engine has checked they are finite)."""
        for p in self.params:
            p.grad = p.main_grad
        norm = grad_norm(self.params)
        if self.clip_grad > 0 and norm > self.clip_grad:
            scale = self.clip_grad / (norm + 1e-6)
            for p in self.params:
                p.grad.mul_(scale)
        self.optimizer.step()
        return True, norm, None

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state)


def grad_norm(params: list[torch.Tensor]) -> float:
    """Global L2 norm of the gradients over the model-parallel (TP × PP) group: TP-replicated
    weights and the last stage's copy of a tied embedding count once, as in megatron."""
    square = torch.zeros(1, dtype=torch.float64)
    for p in params:
        if param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p):
            square += p.grad.double().pow(2).sum()
    dist.all_reduce(square, group=parallel_state.get_model_parallel_group())
    return float(square.sqrt())


def grad_scaler(optimizer: Any) -> Any | None:
    """The loss scaler of megatron's optimizer (megatron builds a DynamicGradScaler for fp16
    only), looked up through its ChainedOptimizer; None for bf16, fp32 and the CPU AdamW."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        scaler = getattr(inner, "grad_scaler", None)
        if scaler is not None:
            return scaler
    return None


def optimizer_step(optimizer: Any, gradients_finite: Callable[[], bool]) -> tuple[bool, Any]:
    """Apply one update: (applied, global grad norm or None).

    With a loss scaler (fp16), megatron's `step()` itself unscales the gradients, finds an
    overflow on any rank, lowers the loss scale and skips the update, so it must run every
    step: skipping it on an overflow would keep the scale (2**32 at first) overflowing forever.
    Without one, the update runs only when every rank's reduced gradients are finite.
    """
    if grad_scaler(optimizer) is None and not gradients_finite():
        return False, None
    updated, grad_norm, _ = optimizer.step()
    return updated, grad_norm


def checkpoint_state(optimizer: Any) -> Any:
    """What a checkpoint keeps of the optimizer: its state_dict(), or nothing for megatron's
    DistributedOptimizer. Its Adam moments are DP shards outside state_dict(), which these
    checkpoints do not save (a resume with it is refused), and megatron-core 0.16.1's
    state_dict() without TE or apex asserts one common Adam step over states torch creates in
    the first applied step, so it fails in a checkpoint saved before any (all steps skipped)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    inners = getattr(optimizer, "chained_optimizers", [optimizer])
    if any(isinstance(inner, DistributedOptimizer) for inner in inners):
        return {}
    return optimizer.state_dict()


def torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside `optimizer`: megatron's chain and wrappers, ours, or itself."""
    inners = getattr(optimizer, "chained_optimizers", [optimizer])
    return [o if isinstance(o, torch.optim.Optimizer) else o.optimizer for o in inners]


def build_optimizer(
    chunks: list[torch.nn.Module],
    settings: OptimizerSettings,
    device: str,
    params_dtype: torch.dtype,
    use_distributed_optimizer: bool = False,
) -> tuple[Any, OptimizerParamScheduler]:
    """The device's optimizer over `chunks` (DDP-wrapped) and the scheduler that sets its lr and
    weight decay (constant), applied once here and before every step."""
    if device == "cuda":
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=settings.lr,
                min_lr=settings.lr,
                weight_decay=settings.weight_decay,
                clip_grad=settings.clip_grad,
                bf16=params_dtype == torch.bfloat16,
                fp16=params_dtype == torch.float16,
                params_dtype=params_dtype,
                use_distributed_optimizer=use_distributed_optimizer,
            ),
            chunks,
        )
    else:
        optimizer = MainGradAdamW(chunks, settings)
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=settings.lr,
        max_lr=settings.lr,
        min_lr=settings.lr,
        lr_warmup_steps=0,
        lr_decay_steps=1,
        lr_decay_style="constant",
        start_wd=settings.weight_decay,
        end_wd=settings.weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
    )
    return optimizer, scheduler
