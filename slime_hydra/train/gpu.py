"""The GPU (NCCL) step on megatron-core's own machinery: one GPTModel chunk per VPP stage wrapped
in DistributedDataParallel, `get_forward_backward_func` with one micro-batch iterator per chunk,
per-token loss normalisation (`calculate_per_token_loss`), and megatron's optimizer.

The loss function returns (loss summed over this rank's tokens, its loss-token count, values);
megatron sums the counts over micro-batches, PP and DP×CP in `finalize_model_grads` and scales the
summed gradients by one over that total: the global token mean, for any micro-batch grouping.
Written against megatron-core 0.16.1; it needs CUDA and has not run on a GPU in this repository.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func

from slime_hydra.data.packing import PackedMicrobatch
from slime_hydra.train.engine import MicrobatchSource, StepResult
from slime_hydra.train.flops import ModelDims
from slime_hydra.train.loss import clipped_policy_loss, token_log_probs
from slime_hydra.train.model import build_gpt_model


def to_cuda(mb: PackedMicrobatch) -> dict[str, torch.Tensor | None]:
    """The micro-batch's per-token tensors on this rank's GPU."""
    names = ("tokens", "labels", "loss_mask", "position_ids", "advantages", "old_logprobs")
    return {
        n: None if getattr(mb, n) is None else getattr(mb, n).cuda(non_blocking=True) for n in names
    }


def loss_func(
    batch: dict[str, torch.Tensor | None],
    eps_clip: float,
    eps_clip_high: float,
    output: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """megatron's 3-tuple: (summed loss, loss-token count, [loss, clipfrac, kl] sums for logs)."""
    log_probs = token_log_probs(output, batch["labels"])
    old = batch["old_logprobs"]
    old = log_probs.detach() if old is None else old.reshape(-1)
    loss, num_tokens, metrics = clipped_policy_loss(
        log_probs,
        old,
        batch["advantages"].reshape(-1),
        batch["loss_mask"].reshape(-1),
        1.0,
        eps_clip,
        eps_clip_high,
    )
    sums = torch.stack([loss.detach(), metrics["clipfrac"], metrics["approx_kl"]]).float()
    count = torch.tensor(num_tokens, dtype=torch.int, device=loss.device)
    return loss, count, {"sums": torch.cat([sums, count.float().reshape(1)])}


def forward_step(
    eps_clip: float,
    eps_clip_high: float,
    data_iterator: Iterator[PackedMicrobatch],
    model: torch.nn.Module,
) -> tuple[torch.Tensor, partial]:
    """megatron's forward_step_func: next packed micro-batch → (output, its loss function)."""
    mb = next(data_iterator)
    batch = to_cuda(mb)
    output = model(
        batch["tokens"],
        batch["position_ids"],
        None,
        packed_seq_params=mb.packed_seq_params("cuda"),
    )
    return output, partial(loss_func, batch, eps_clip, eps_clip_high)


class GpuEngine:
    """GPTModel chunks under megatron DDP, trained by megatron's pipeline schedules."""

    pad_multiple: int | None = None

    def __init__(
        self,
        dims: ModelDims,
        lr: float,
        weight_decay: float,
        clip_grad: float,
        eps_clip: float,
        eps_clip_high: float,
        params_dtype: str,
        sequence_parallel: bool = False,
    ) -> None:
        dtype = getattr(torch, params_dtype)
        vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
        )
        chunks = []
        for stage in range(vpp):
            model = build_gpt_model(
                dims,
                "cuda",
                params_dtype=dtype,
                vp_stage=stage if vpp > 1 else None,
                sequence_parallel=sequence_parallel,
            )
            model.config.variable_seq_lengths = True
            model.config.calculate_per_token_loss = True
            chunks.append(
                DistributedDataParallel(
                    config=model.config,
                    ddp_config=ddp_config,
                    module=model,
                    disable_bucketing=stage > 0,
                )
            )
        config = chunks[0].config
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = [c.no_sync for c in chunks] if vpp > 1 else chunks[0].no_sync
        self.chunks = chunks
        self.model = torch.nn.ModuleList(chunks)
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=lr,
                weight_decay=weight_decay,
                clip_grad=clip_grad,
                bf16=dtype == torch.bfloat16,
                fp16=dtype == torch.float16,
                params_dtype=dtype,
            ),
            chunks,
        )
        config.grad_scale_func = self.optimizer.scale_loss
        self.step_fn = partial(forward_step, eps_clip, eps_clip_high)

    def train_step(self, microbatches: MicrobatchSource) -> StepResult:
        """One optimizer step: megatron's schedule over one iterator per VPP chunk."""
        iterators = [microbatches() for _ in self.chunks]
        num_microbatches = len(iterators[0])
        # megatron's p2p shapes take the full (pre-CP-split) length; variable_seq_lengths=True
        # sends each micro-batch's own shape, so this is the step's longest.
        cp = parallel_state.get_context_parallel_world_size()
        seq_length = cp * max(mb.tokens.shape[1] for mb in microbatches())
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        losses = get_forward_backward_func()(
            forward_step_func=self.step_fn,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=num_microbatches,
            seq_length=seq_length,
            micro_batch_size=1,
            forward_only=False,
        )
        _, grad_norm, _ = self.optimizer.step()
        # Only the last pipeline stage has losses: sum over DP×CP, then over PP (others add 0).
        sums = torch.zeros(4, device="cuda")
        for out in losses:
            sums += out["sums"]
        dist.all_reduce(
            sums, group=parallel_state.get_data_parallel_group(with_context_parallel=True)
        )
        dist.all_reduce(sums, group=parallel_state.get_pipeline_model_parallel_group())
        loss, clipfrac, approx_kl, tokens = sums.tolist()
        tokens = max(tokens, 1.0)
        return StepResult(
            loss=loss / tokens,
            grad_norm=float(grad_norm),
            lr=self.optimizer.param_groups[0]["lr"],
            clipfrac=clipfrac / tokens,
            approx_kl=approx_kl / tokens,
        )
