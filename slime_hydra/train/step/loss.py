"""GRPO/PPO clipped policy loss on THD-packed micro-batches.

Per-position tensors follow `slime_hydra.data.packing`: position t of the packed stream holds
token t and its label, token t+1 of the same sequence; `loss_mask`, `advantages` and
`old_log_probs` at t belong to that label. So the log-prob at t is read off the logits at t,
and a sequence's last position (no label) is outside the loss mask.

The loss of a micro-batch is a sum over its loss tokens divided by `normalizer`, the number of
loss tokens in the whole global batch (all micro-batches, all DP ranks). Summing micro-batch
losses, or their gradients, therefore gives the same result however samples are grouped.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state, tensor_parallel


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(labels[t] | logits[t]) as a flat [T], from logits [T, V] or GPTModel's [1, T, V].

    With tensor parallelism > 1 the logits are this rank's vocab shard [.., V/tp], and megatron's
    vocab-parallel cross entropy (which all-reduces over the TP group) gives the full-vocab
    log-prob, identical on every TP rank. Computed in float32, or float64 for float64 logits.
    """
    logits = logits.reshape(-1, logits.shape[-1])
    labels = labels.reshape(-1)
    tp = (
        parallel_state.get_tensor_model_parallel_world_size()
        if parallel_state.model_parallel_is_initialized()
        else 1
    )
    if tp > 1:
        # vocab_parallel_cross_entropy works in place on its float32 input: hand it a copy.
        shard = logits.to(torch.float32, copy=True)
        return -tensor_parallel.vocab_parallel_cross_entropy(shard, labels)
    dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16 → fp32, fp64 stays
    log_probs = torch.log_softmax(logits.to(dtype), dim=-1)
    return log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def clipped_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    normalizer: float | torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_high: float = 0.28,
) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """PPO clipped surrogate: Σ_mask max(-A·r, -A·clip(r, 1-ε, 1+ε_high)) / normalizer.

    r = exp(log_probs - old_log_probs). Returns (loss, number of loss tokens, metrics); each
    metric is also a masked sum divided by `normalizer`, so summing it over micro-batches and
    DP ranks gives the global per-token mean: `clipfrac` (share of tokens whose clipped branch
    is active), `approx_kl` (mean old_logp - logp) and `ratio` (mean r).
    """
    if float(normalizer) <= 0:
        raise ValueError(
            f"normalizer must be the positive global loss-token count, got {normalizer}"
        )
    mask = loss_mask.to(log_probs.dtype)
    log_ratio = log_probs - old_log_probs.to(log_probs.dtype)
    ratio = torch.exp(log_ratio)
    advantages = advantages.to(log_probs.dtype)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip_high)
    per_token = torch.maximum(unclipped, clipped)
    loss = (per_token * mask).sum() / normalizer
    with torch.no_grad():
        metrics = {
            "clipfrac": ((clipped > unclipped).to(mask.dtype) * mask).sum() / normalizer,
            "approx_kl": (-log_ratio * mask).sum() / normalizer,
            "ratio": (ratio * mask).sum() / normalizer,
        }
    return loss, int(loss_mask.sum()), metrics


def policy_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    normalizer: float | torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_high: float = 0.28,
) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """Clipped policy loss of one packed micro-batch from GPTModel logits [1, T, V(/tp)].

    `labels`, `old_log_probs`, `advantages` (per token) and `loss_mask` are [T] or [1, T],
    aligned with the logits as `PackedMicrobatch` lays them out.
    """
    return clipped_policy_loss(
        token_log_probs(logits, labels),
        old_log_probs.reshape(-1),
        advantages.reshape(-1),
        loss_mask.reshape(-1),
        normalizer,
        eps_clip,
        eps_clip_high,
    )
