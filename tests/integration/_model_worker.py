"""torchrun worker for test_model_cpu.py: tiny GPTModel on gloo, forward+backward on a THD batch.

Usage: python -m torch.distributed.run --standalone --nproc-per-node N _model_worker.py OUT TP
Rank 0 writes the full-vocab logits and the checks' raw values to OUT (torch.save).
"""

from __future__ import annotations

import sys
from itertools import accumulate
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from omegaconf import OmegaConf

from slime_hydra.data.packing import ThdParams, thd_params
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.run.distributed import destroy_distributed, init_distributed, seed_everything
from slime_hydra.train.step.loss import policy_loss
from slime_hydra.train.step.model import build_model_chunks

REPO = Path(__file__).resolve().parents[2]
LENGTHS = [5, 9, 3]


def packed_inputs(tokens: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, ThdParams]:
    """input_ids [1, T], position_ids [1, T] (restarting per sequence) and THD params."""
    params = thd_params([0, *accumulate(len(t) for t in tokens)])
    positions = torch.cat([torch.arange(len(t)) for t in tokens]).unsqueeze(0)
    return torch.cat(tokens).unsqueeze(0), positions, params


def full_logits(
    model: torch.nn.Module, tokens: list[torch.Tensor], packed: bool = True
) -> torch.Tensor:
    """Forward the sequences (THD-packed, or one unpacked SBHD sequence) → gathered [T, V]."""
    ids, positions, params = packed_inputs(tokens)
    with torch.no_grad():
        shard = model(ids, positions, None, packed_seq_params=params if packed else None)[0]
    group = parallel_state.get_tensor_model_parallel_group()
    shards = [torch.empty_like(shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(shards, shard.contiguous(), group=group)
    return torch.cat(shards, dim=-1)


def main(out: str, tp: int) -> None:
    """Build the tiny model with tp, run the checks' forwards and one backward, save on rank 0."""
    init_distributed(tp=tp)
    try:
        seed_everything(1234)
        dims = ModelDims.from_mapping(OmegaConf.load(REPO / "conf/model/tiny.yaml"))
        (model,) = build_model_chunks(dims, seed=1234)
        gen = torch.Generator().manual_seed(0)
        tokens = [torch.randint(0, 256, (n,), generator=gen) for n in LENGTHS]
        perturbed = [torch.randint(0, 256, (LENGTHS[0],), generator=gen), *tokens[1:]]

        ids, positions, params = packed_inputs(tokens)
        logits = model(ids, positions, None, packed_seq_params=params)
        # Labels are next tokens within each sequence; a sequence's last position has none.
        labels = torch.cat([torch.cat([t[1:], t.new_zeros(1)]) for t in tokens])
        mask = torch.cat([torch.arange(n) < n - 1 for n in LENGTHS]).float()
        advantages = torch.repeat_interleave(torch.tensor([1.0, -0.5, 0.25]), torch.tensor(LENGTHS))
        loss, num_tokens, _ = policy_loss(
            logits,
            labels,
            old_log_probs=torch.full((sum(LENGTHS),), -5.5),
            advantages=advantages,
            loss_mask=mask,
            normalizer=int(mask.sum()),
        )
        loss.backward()
        # Norm weights are replicated on every TP rank: count them once in the TP-wide norm.
        grad_sq = sum(
            p.grad.pow(2).sum()
            for p in model.parameters()
            if tensor_parallel.param_is_not_tensor_parallel_duplicate(p)
        )
        dist.all_reduce(grad_sq, group=parallel_state.get_tensor_model_parallel_group())
        losses = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(losses, loss.detach().reshape(1))

        result = {
            "loss": loss.item(),
            "losses_per_rank": [x.item() for x in losses],
            "num_tokens": num_tokens,
            "grad_norm": grad_sq.sqrt().item(),
            "num_params_without_grad": sum(p.grad is None for p in model.parameters()),
            "logits": full_logits(model, tokens),
            "logits_perturbed": full_logits(model, perturbed),
            "logits_alone": full_logits(model, tokens[1:2]),
            "logits_unpacked": full_logits(model, tokens[1:2], packed=False),
        }
        if dist.get_rank() == 0:
            torch.save(result, out)
    finally:
        destroy_distributed()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
