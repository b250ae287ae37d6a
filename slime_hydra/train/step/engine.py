"""The one training engine: megatron-core's own step on every device.

One GPTModel chunk per VPP stage wrapped in megatron's DistributedDataParallel,
`get_forward_backward_func` (no pipelining, 1F1B or interleaved 1F1B, chosen by megatron from
the layout) with one pass of the rank's micro-batch iterator per chunk, per-token loss
normalisation (`calculate_per_token_loss`) and `finalize_model_grads`. Devices differ only in
backend (gloo/NCCL), attention kernel (packed torch SDPA / Transformer Engine), dtype and the
optimizer class (train/step/optimizer.py); on CPU, `cpu_shim` maps megatron's CUDA placements.

The loss function returns (loss summed over this rank's tokens, its loss-token count, sums for
logging); megatron sums the counts over micro-batches, PP and DP×CP in `finalize_model_grads`
and scales the summed gradients by one over that total: the global token mean, for any
micro-batch grouping and any layout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.pipeline_parallel import get_forward_backward_func

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.data.packing import PackedMicrobatch
from slime_hydra.schedule import ParallelLayout
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.step.loss import clipped_policy_loss, token_log_probs
from slime_hydra.train.step.model import Device, build_model_chunks, seq_params_device
from slime_hydra.train.step.optimizer import (
    OptimizerSettings,
    build_optimizer,
    grad_scaler,
    optimizer_step,
)


@dataclass(frozen=True)
class StepResult:
    """Global values of one optimizer step, the same on every rank."""

    loss: float
    """Policy loss: a token mean over the whole global batch."""
    grad_norm: float
    """Global gradient norm before clipping (nan when the step was skipped)."""
    lr: float
    clipfrac: float
    approx_kl: float
    skipped: bool = False
    """The optimizer did not update: a non-finite gradient, or an fp16 loss-scale overflow."""
    overflow: bool = False
    """Skipped by fp16 dynamic loss scaling while the scale could still come down (the loss
    finite): expected in the first steps, as megatron lowers the scale from 2**32."""
    loss_scale: float | None = None
    """The fp16 loss scale this step's backward ran with; None without loss scaling."""
    max_memory_gib: float | None = None
    """Peak CUDA memory allocated during the step, the largest over all ranks (GPU only)."""
    max_memory_reserved_gib: float | None = None
    """Peak CUDA memory the caching allocator held during the step (allocated, cached and
    fragmented), the largest over all ranks (GPU only)."""
    schedule_s: float = 0.0
    """Seconds in megatron's schedule on this rank, until its loss sums were on the host:
    forward, backward, p2p and finalize_model_grads (python -m slime_hydra.calibrate splits
    the step time with it)."""
    grad_reduce_s: float = 0.0
    """Seconds of this rank's finalize_model_grads in that schedule: the DP (and embedding)
    gradient all-reduce."""

    def metrics(self) -> dict[str, float]:
        """DESIGN.md's train/* metrics, the PPO diagnostics, train/loss_scale under fp16, and
        perf/max_memory_gib and perf/max_memory_reserved_gib on GPU."""
        metrics = {
            "train/loss": self.loss,
            "train/grad_norm": self.grad_norm,
            "train/lr": self.lr,
            "train/clipfrac": self.clipfrac,
            "train/approx_kl": self.approx_kl,
        }
        if self.loss_scale is not None:
            metrics["train/loss_scale"] = self.loss_scale
        if self.max_memory_gib is not None:
            metrics["perf/max_memory_gib"] = self.max_memory_gib
        if self.max_memory_reserved_gib is not None:
            metrics["perf/max_memory_reserved_gib"] = self.max_memory_reserved_gib
        return metrics


def loss_scale_overflow(
    scaler: Any | None, scale: float | None, updated: bool, loss: float
) -> bool:
    """Whether a step was skipped by dynamic loss scaling that can still lower the scale (above
    megatron's min_scale; a ConstantGradScaler cannot): an fp16 overflow, not a diverged
    model, so long as the loss itself is finite."""
    min_scale = getattr(scaler, "min_scale", None)
    if updated or min_scale is None or scale is None or not math.isfinite(loss):
        return False
    return scale > float(min_scale)


@dataclass(frozen=True)
class PolicyLoss:
    """The PPO clipped-ratio bounds of trainer.eps_clip / eps_clip_high."""

    eps_clip: float = 0.2
    eps_clip_high: float = 0.28

    def __call__(
        self, mb: dict[str, torch.Tensor | None], output: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """megatron's 3-tuple: (summed loss, loss-token count, [loss, clipfrac, kl, count] sums).

        Without rollout log-probs the old policy is the current one (ratio 1, on-policy).
        """
        log_probs = token_log_probs(output, mb["labels"])
        old = mb["old_logprobs"]
        old = log_probs.detach() if old is None else old.reshape(-1)
        loss, num_tokens, metrics = clipped_policy_loss(
            log_probs,
            old,
            mb["advantages"].reshape(-1),
            mb["loss_mask"].reshape(-1),
            1.0,
            self.eps_clip,
            self.eps_clip_high,
        )
        count = torch.tensor(num_tokens, dtype=torch.int, device=loss.device)
        sums = torch.stack(
            [loss.detach(), metrics["clipfrac"], metrics["approx_kl"], count.to(loss.dtype)]
        )
        return loss, count, {"sums": sums.double()}


TENSORS = ("tokens", "labels", "loss_mask", "position_ids", "advantages", "old_logprobs")


def forward_step(
    loss: PolicyLoss,
    device: Device,
    data_iterator: Iterator[PackedMicrobatch],
    model: torch.nn.Module,
) -> tuple[torch.Tensor, partial]:
    """megatron's forward_step_func: next packed micro-batch → (model output, its loss)."""
    mb = next(data_iterator)
    batch = {
        name: None if getattr(mb, name) is None else getattr(mb, name).to(device, non_blocking=True)
        for name in TENSORS
    }
    output = model(
        batch["tokens"],
        batch["position_ids"],
        None,
        packed_seq_params=mb.packed_seq_params(seq_params_device(device)),
    )
    return output, partial(loss, batch)


class MegatronEngine:
    """This rank's model chunks under megatron DDP, trained by megatron's pipeline schedules."""

    def __init__(
        self,
        dims: ModelDims,
        layout: ParallelLayout,
        optimizer: OptimizerSettings,
        loss: PolicyLoss,
        seed: int,
        device: Device = "cpu",
        params_dtype: torch.dtype = torch.float32,
        use_distributed_optimizer: bool = False,
    ) -> None:
        self.device = device
        chunks = build_model_chunks(
            dims,
            seed,
            device,
            params_dtype,
            sequence_parallel=layout.sequence_parallel,
            microbatch_group_size_per_vp_stage=layout.vp_group_size if layout.vpp > 1 else None,
        )
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=use_distributed_optimizer,
        )
        self.chunks = [
            DistributedDataParallel(
                config=chunk.config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0
            )
            for i, chunk in enumerate(chunks)
        ]
        config = self.chunks[0].config
        config.finalize_model_grads_func = self.finalize_grads
        self.grad_reduce_s = 0.0
        no_sync = [c.no_sync for c in self.chunks]
        config.no_sync_func = no_sync if len(no_sync) > 1 else no_sync[0]
        self.model = torch.nn.ModuleList(self.chunks)
        self.optimizer, self.scheduler = build_optimizer(
            self.chunks, optimizer, device, params_dtype, use_distributed_optimizer
        )
        self.grad_scaler = grad_scaler(self.optimizer)
        if device == "cuda":
            config.grad_scale_func = self.optimizer.scale_loss
        self.step_fn = partial(forward_step, loss, device)

    def finalize_grads(self, *args: Any, **kwargs: Any) -> None:
        """megatron's finalize_model_grads (the gradient all-reduces), timed into
        grad_reduce_s; on CUDA between synchronisations, so that it counts the reduction and
        not the backward kernels still queued before it."""
        if self.device == "cuda":
            torch.cuda.synchronize()
        tic = time.perf_counter()
        finalize_model_grads(*args, **kwargs)
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.grad_reduce_s = time.perf_counter() - tic

    def forward_backward(self, microbatches: MicrobatchIterator) -> torch.Tensor:
        """Run megatron's schedule over the rank's micro-batches; leave the reduced, token-mean
        gradients in each parameter's `main_grad`; return [loss, clipfrac, kl, tokens] sums over
        the whole step (every rank)."""
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        iterators = [iter(microbatches) for _ in self.chunks]
        outputs = get_forward_backward_func()(
            forward_step_func=self.step_fn,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=len(microbatches),
            # Ignored under variable_seq_lengths (shapes travel with each micro-batch), but
            # megatron wants a size: the step's longest micro-batch, from lengths alone.
            seq_length=microbatches.seq_length(),
            micro_batch_size=1,
            forward_only=False,
        )
        # Only the last pipeline stage has losses: sum over DP×CP, then over PP (others add 0).
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)
        for out in outputs:
            sums += out["sums"]
        dist.all_reduce(
            sums, group=parallel_state.get_data_parallel_group(with_context_parallel=True)
        )
        dist.all_reduce(sums, group=parallel_state.get_pipeline_model_parallel_group())
        return sums

    def gradients_finite(self) -> bool:
        """Whether every rank's reduced gradients are finite (one flag, agreed by all ranks)."""
        grads = [p.main_grad for c in self.chunks for p in c.parameters() if p.requires_grad]
        finite = torch.ones(1, device=self.device)
        if grads:
            finite *= torch.stack(torch._foreach_norm(grads)).isfinite().all()
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        return bool(finite.item())

    def peak_memory_gib(self) -> tuple[float | None, float | None]:
        """The step's peak CUDA memory (allocated, reserved), each the largest over all ranks;
        None on CPU."""
        if self.device != "cuda":
            return None, None
        peak = torch.tensor(
            [torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        allocated, reserved = (peak / 2**30).tolist()
        return allocated, reserved

    def train_step(self, microbatches: MicrobatchIterator) -> StepResult:
        """One optimizer step over this rank's micro-batches of the step."""
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        tic = time.perf_counter()
        loss, clipfrac, approx_kl, tokens = self.forward_backward(microbatches).tolist()
        schedule_s = time.perf_counter() - tic
        # The scheduler sets lr and weight decay × wd_mult in every group (again after a
        # checkpoint load restored the saved ones).
        self.scheduler.step(1)
        scale = None if self.grad_scaler is None else float(self.grad_scaler.scale.item())
        updated, grad_norm = optimizer_step(self.optimizer, self.gradients_finite)
        tokens = max(tokens, 1.0)
        allocated, reserved = self.peak_memory_gib()
        return StepResult(
            loss=loss / tokens,
            grad_norm=float("nan") if grad_norm is None else float(grad_norm),
            lr=self.optimizer.param_groups[0]["lr"],
            clipfrac=clipfrac / tokens,
            approx_kl=approx_kl / tokens,
            skipped=not updated,
            overflow=loss_scale_overflow(self.grad_scaler, scale, updated, loss),
            loss_scale=scale,
            max_memory_gib=allocated,
            max_memory_reserved_gib=reserved,
            schedule_s=schedule_s,
            grad_reduce_s=self.grad_reduce_s,
        )
