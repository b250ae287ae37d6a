"""Pack one micro-batch of samples into megatron-core's THD layout, optionally one CP rank's share.

Conventions (those of megatron-core's THD path with Transformer Engine, and of slime):
- Next-token alignment happens on the full sequence, before any CP slicing: position t holds
  token t, label token t+1 of the same sequence, and the loss mask / advantage / old log-prob
  of token t+1 when t+1 is a response token. A sequence's last position is never in the loss.
- With cp > 1 each sequence is padded to a multiple of 2*cp and cut into 2*cp equal chunks;
  CP rank r keeps chunks r and 2*cp-1-r (the zig-zag split of `get_batch_on_this_cp_rank`
  and TE's `thd_get_partitioned_indices`). `cu_seqlens` are those of the full padded
  sequences, the same on every CP rank, as TE's CP attention expects.
- The packed length on this rank is padded to a multiple of `pad_multiple` by one extra
  pseudo-sequence at the end (zero loss mask), not by lengthening the last sequence: the real
  sequences' attention and CP split stay exactly as without padding, `cu_seqlens[-1]` still
  equals the packed length (× cp), as TE's THD kernels require, and it is slime's layout.
  Padding inside a sequence (CP only) is counted in its `cu_seqlens` span; it comes after the
  real tokens, so causal attention keeps it out of every real token's output, and the plain
  `cu_seqlens_q` form works with both the flash-attn and fused TE back ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from slime_hydra.data.tokens import RolloutTokens


@dataclass(frozen=True, eq=False)
class PackedMicrobatch:
    """One micro-batch as THD tensors for one (DP, CP) rank; every per-token tensor is [1, T].

    `num_tokens` and `num_loss_tokens` count the micro-batch's real tokens and loss tokens over
    whole sequences, the same on every CP rank, so a CP group can normalise a loss without
    communicating.
    """

    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None
    cu_seqlens: torch.Tensor
    max_seqlen: int
    num_tokens: int
    num_loss_tokens: int
    sample_indices: np.ndarray

    def packed_seq_params(self, device: torch.device | str | None = None) -> ThdParams:
        """megatron-core's THD params for these sequences, cu_seqlens on `device` (None: the
        host, where megatron's unfused RoPE and our attention read them without a sync)."""
        return thd_params(self.cu_seqlens.tolist(), device)


@dataclass
class ThdParams(PackedSeqParams):
    """megatron-core's PackedSeqParams (qkv_format 'thd') that also carries the sequence
    boundaries as Python ints, so the packed attention (train/step/attention.py) slices sequences
    without reading cu_seqlens back from the GPU in every layer."""

    bounds: tuple[int, ...] = ()
    """cu_seqlens as ints: 0, the end of each packed sequence, ..., the packed length (× cp)."""


def thd_params(bounds: Sequence[int], device: torch.device | str | None = None) -> ThdParams:
    """THD params of packed sequences with these boundaries; cu_seqlens (int32) on `device`,
    the host when None. Transformer Engine's kernels need them on the GPU."""
    cu = torch.tensor(bounds, dtype=torch.int32)
    if device is not None:
        cu = cu.to(device, non_blocking=True)
    longest = max(b - a for a, b in pairwise(bounds))
    return ThdParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
        bounds=tuple(int(b) for b in bounds),
    )


def _local_positions(kept: np.ndarray, cp_size: int, cp_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequence number and in-sequence position of each packed slot, given slots per sequence."""
    seq = np.repeat(np.arange(len(kept)), kept)
    within = np.arange(int(kept.sum()), dtype=np.int64) - np.repeat(np.cumsum(kept) - kept, kept)
    if cp_size == 1:
        return seq, within
    chunk = kept[seq] // 2
    first = within < chunk
    pos = np.where(
        first,
        cp_rank * chunk + within,
        (2 * cp_size - 1 - cp_rank) * chunk + within - chunk,
    )
    return seq, pos


def pack_microbatch(
    data: RolloutTokens,
    sample_indices: Sequence[int] | np.ndarray,
    *,
    pad_multiple: int,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> PackedMicrobatch:
    """Pack the given samples (global indices, in order) as THD tensors for one CP rank."""
    idx = np.asarray(sample_indices, dtype=np.int64)
    length = data.total_lengths[idx]
    resp = data.response_lengths[idx]
    prompt = length - resp
    unit = 2 * cp_size if cp_size > 1 else 1
    padded = -(-length // unit) * unit
    seq, pos = _local_positions(padded // cp_size, cp_size, cp_rank)

    num_local = len(pos)
    pad = -num_local % pad_multiple
    size = num_local + pad
    g = data.offsets[idx][seq] + pos
    real = pos < length[seq]
    has_label = pos + 1 < length[seq]
    r = pos + 1 - prompt[seq]
    in_resp = (r >= 0) & (r < resp[seq])
    ridx = (data.response_offsets[idx][seq] + r)[in_resp]

    def gather(values: np.ndarray, where: np.ndarray, at: np.ndarray, dtype: type) -> np.ndarray:
        out = np.zeros(size, dtype=dtype)
        out[:num_local][where] = values[at]
        return out

    tokens = gather(data.tokens, real, g[real], np.int64)
    labels = gather(data.tokens, has_label, g[has_label] + 1, np.int64)
    loss_mask = gather(data.loss_mask, in_resp, ridx, np.float32)
    advantages = gather(data.advantages, in_resp, ridx, np.float32)
    old_logprobs = (
        None if data.old_logprobs is None else gather(data.old_logprobs, in_resp, ridx, np.float32)
    )
    position_ids = np.concatenate([pos, np.arange(pad, dtype=np.int64)])

    cu = np.zeros(len(idx) + 1 + (pad > 0), dtype=np.int64)
    np.cumsum(padded, out=cu[1 : len(idx) + 1])
    if pad:
        cu[-1] = cu[-2] + pad * cp_size

    cm = data.loss_mask_cumsum
    r_start = data.response_offsets[idx]
    first_predicted = np.minimum(resp, np.maximum(0, 1 - prompt))
    num_loss_tokens = int((cm[r_start + resp] - cm[r_start + first_predicted]).sum())

    def row(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).unsqueeze(0)

    return PackedMicrobatch(
        tokens=row(tokens),
        labels=row(labels),
        loss_mask=row(loss_mask),
        position_ids=row(position_ids),
        advantages=row(advantages),
        old_logprobs=None if old_logprobs is None else row(old_logprobs),
        cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
        max_seqlen=int(np.diff(cu).max()),
        num_tokens=int(length.sum()),
        num_loss_tokens=num_loss_tokens,
        sample_indices=idx,
    )
