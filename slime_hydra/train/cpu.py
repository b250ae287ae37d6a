"""The CPU (gloo) step: megatron-core 0.16's forward-backward schedules hard-code CUDA, so this
runs the equivalent loop itself: forward and backward per micro-batch, the loss normalised by
the global loss-token count, gradients summed over DP, a TP-aware norm, clipping, AdamW."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from slime_hydra.data.packing import PackedMicrobatch
from slime_hydra.errors import SlimeHydraError
from slime_hydra.train.engine import MicrobatchSource, StepResult
from slime_hydra.train.flops import ModelDims
from slime_hydra.train.loss import clipped_policy_loss, token_log_probs
from slime_hydra.train.model import build_gpt_model


def global_loss_tokens(microbatches: Sequence[PackedMicrobatch]) -> int:
    """Loss tokens of the whole step: this rank's count summed over the DP group."""
    count = torch.tensor([sum(mb.num_loss_tokens for mb in microbatches)], dtype=torch.int64)
    dist.all_reduce(count, group=parallel_state.get_data_parallel_group())
    return int(count.item())


def forward_backward(
    model: torch.nn.Module,
    microbatches: Sequence[PackedMicrobatch],
    normalizer: int,
    eps_clip: float,
    eps_clip_high: float,
) -> torch.Tensor:
    """Accumulate this rank's gradients; return [loss, clipfrac, approx_kl] sums (rank's share).

    Without rollout log-probs the old policy is the current one (ratio 1, on-policy).
    """
    sums = torch.zeros(3, dtype=torch.float64)
    for mb in microbatches:
        logits = model(mb.tokens, mb.position_ids, None, packed_seq_params=mb.packed_seq_params())
        log_probs = token_log_probs(logits, mb.labels)
        old = log_probs.detach() if mb.old_logprobs is None else mb.old_logprobs.reshape(-1)
        loss, _, metrics = clipped_policy_loss(
            log_probs,
            old,
            mb.advantages.reshape(-1),
            mb.loss_mask.reshape(-1),
            normalizer,
            eps_clip,
            eps_clip_high,
        )
        loss.backward()
        sums += torch.stack([loss.detach(), metrics["clipfrac"], metrics["approx_kl"]]).double()
    return sums


def allreduce_gradients(model: torch.nn.Module) -> None:
    """Sum gradients over the DP group (the loss is already a global mean), in one buffer."""
    if parallel_state.get_data_parallel_world_size() == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=parallel_state.get_data_parallel_group())
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(reduced)


def clip_gradients(model: torch.nn.Module, max_norm: float) -> float:
    """Global gradient norm (TP shards summed, replicated weights once); clip to max_norm > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    square = torch.zeros(1, dtype=torch.float64)
    for p in params:
        if param_is_not_tensor_parallel_duplicate(p):
            square += p.grad.double().pow(2).sum()
    dist.all_reduce(square, group=parallel_state.get_tensor_model_parallel_group())
    norm = float(square.sqrt())
    if max_norm > 0 and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for p in params:
            p.grad.mul_(scale)
    return norm


class CpuEngine:
    """The megatron-core GPTModel on CPU with torch's AdamW."""

    pad_multiple: int | None = 1
    """No sequence parallelism or TE kernels on CPU: micro-batches need no padding."""

    def __init__(
        self,
        dims: ModelDims,
        lr: float,
        weight_decay: float,
        clip_grad: float,
        eps_clip: float,
        eps_clip_high: float,
    ) -> None:
        self.model = build_gpt_model(dims, "cpu")
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=weight_decay
        )
        self.clip_grad = clip_grad
        self.eps_clip = eps_clip
        self.eps_clip_high = eps_clip_high

    def train_step(self, microbatches: MicrobatchSource) -> StepResult:
        """One optimizer step over this rank's micro-batches."""
        packed = list(microbatches())
        normalizer = global_loss_tokens(packed)
        if normalizer == 0:
            raise SlimeHydraError(
                "a step has no loss tokens on any rank (every loss mask is zero); check the "
                "rollout's loss masks or response lengths."
            )
        self.optimizer.zero_grad(set_to_none=False)
        sums = forward_backward(self.model, packed, normalizer, self.eps_clip, self.eps_clip_high)
        allreduce_gradients(self.model)
        dist.all_reduce(sums, group=parallel_state.get_data_parallel_group())
        grad_norm = clip_gradients(self.model, self.clip_grad)
        self.optimizer.step()
        loss, clipfrac, approx_kl = sums.tolist()
        return StepResult(
            loss=loss,
            grad_norm=grad_norm,
            lr=self.optimizer.param_groups[0]["lr"],
            clipfrac=clipfrac,
            approx_kl=approx_kl,
        )
