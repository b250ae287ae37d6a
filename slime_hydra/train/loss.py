"""GRPO/PPO clipped policy loss on THD-packed micro-batches.

Per-token tensors are aligned with the packed token stream `tokens` [T]: entry t belongs to
token t, scored by the logits at position t-1 of the same sequence. The first token of each
sequence has no log-prob and must be outside the loss mask (it is always a prompt token).

The loss of a micro-batch is a sum over its loss tokens divided by `normalizer`, the number of
loss tokens in the whole global batch (all micro-batches, all DP ranks). Summing micro-batch
losses, or their gradients, therefore gives the same result however samples are grouped.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state, tensor_parallel


def broadcast_per_sample(values: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Repeat one value per packed sequence (e.g. its advantage) over that sequence's tokens."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.long)
    return torch.repeat_interleave(values, lengths.to(values.device))


def sequence_start_mask(cu_seqlens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Bool [T], True at the first token of each packed sequence (which has no log-prob)."""
    starts = torch.zeros(num_tokens, dtype=torch.bool, device=cu_seqlens.device)
    starts[cu_seqlens[:-1].to(torch.long)] = True
    return starts


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log p(tokens[t+1] | logits[t]) for packed logits [T, V] (or [1, T, V]); last entry is 0.

    With tensor parallelism > 1 the logits are this rank's vocab shard [T, V/tp], and megatron's
    vocab-parallel cross entropy (which all-reduces over the TP group) gives the full-vocab
    log-prob, identical on every TP rank.
    """
    logits = logits.reshape(-1, logits.shape[-1])
    targets = torch.roll(tokens.reshape(-1), shifts=-1)
    tp = (
        parallel_state.get_tensor_model_parallel_world_size()
        if parallel_state.model_parallel_is_initialized()
        else 1
    )
    if tp > 1:
        # vocab_parallel_cross_entropy works in place on its float32 input: hand it a copy.
        shard = logits.to(torch.float32, copy=True)
        log_probs = -tensor_parallel.vocab_parallel_cross_entropy(shard, targets)
    else:
        dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16 → fp32, fp64 stays
        log_probs = torch.log_softmax(logits.to(dtype), dim=-1)
        log_probs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.cat([log_probs[:-1], log_probs.new_zeros(1)])


def packed_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, cu_seqlens: torch.Tensor
) -> torch.Tensor:
    """Log-prob [T] of each packed token given its own sequence's prefix; 0 at sequence starts."""
    by_position = token_log_probs(logits, tokens)
    shifted = torch.roll(by_position, shifts=1)
    starts = sequence_start_mask(cu_seqlens, shifted.shape[0])
    return shifted.masked_fill(starts, 0.0)


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
    tokens: torch.Tensor,
    cu_seqlens: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    normalizer: float | torch.Tensor,
    eps_clip: float = 0.2,
    eps_clip_high: float = 0.28,
) -> tuple[torch.Tensor, int, dict[str, torch.Tensor]]:
    """Clipped policy loss of one packed micro-batch from GPTModel logits [1, T, V(/tp)].

    `old_log_probs`, `advantages` (already broadcast per token, see `broadcast_per_sample`) and
    `loss_mask` are [T], aligned with `tokens`; the mask must be 0 at each sequence's first token.
    """
    tokens = tokens.reshape(-1)
    loss_mask = loss_mask.reshape(-1)
    starts = sequence_start_mask(cu_seqlens, tokens.shape[0])
    if bool((loss_mask.bool() & starts).any()):
        raise ValueError(
            "loss_mask covers the first token of a packed sequence, which has no log-prob: "
            "mask only response tokens"
        )
    log_probs = packed_log_probs(logits, tokens, cu_seqlens)
    return clipped_policy_loss(
        log_probs,
        old_log_probs.reshape(-1),
        advantages.reshape(-1),
        loss_mask,
        normalizer,
        eps_clip,
        eps_clip_high,
    )
