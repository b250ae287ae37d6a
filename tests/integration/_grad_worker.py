"""torchrun worker for test_train_gradients.py: one step's gradients under several batchings.

Usage: python -m torch.distributed.run --standalone --nproc-per-node DP _grad_worker.py OUT
Every rank builds the same tiny model and rollout; for each batching it accumulates step 0's
gradients through the CPU trainer's own functions and sums them over DP. Rank 0 saves
{name: flat gradient} to OUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from omegaconf import OmegaConf

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.partition import CappedPartitioner
from slime_hydra.schedule import DynamicBatching, FixedBatching, ParallelLayout
from slime_hydra.train.cpu import allreduce_gradients, forward_backward, global_loss_tokens
from slime_hydra.train.distributed import destroy_distributed, init_distributed, seed_everything
from slime_hydra.train.model import build_gpt_model
from slime_hydra.train.trainer import with_tokens

REPO = Path(__file__).resolve().parents[2]
GLOBAL_BATCH = 16


def main(out: str) -> None:
    """Step 0's DP-summed gradients for dynamic, fixed and one-sample micro-batches."""
    init_distributed(tp=1)
    try:
        seed_everything(1234)
        model = build_gpt_model(OmegaConf.load(REPO / "conf/model/tiny.yaml"))
        source = SyntheticGRPO(
            num_prompts=4,
            n_samples_per_prompt=4,
            prompt_len_median=24,
            max_prompt_len=60,
            response_len_median=48,
            max_response_len=150,
        )
        rollout = with_tokens(source.load(), vocab_size=256, seed=7)
        layout = ParallelLayout(dp=dist.get_world_size())
        strategies = {
            "dynamic": DynamicBatching(
                layout, GLOBAL_BATCH, max_tokens_per_gpu=256, partitioner=CappedPartitioner()
            ),
            "fixed": FixedBatching(layout, GLOBAL_BATCH, micro_batch_size=4),
            "one_per_mb": FixedBatching(layout, GLOBAL_BATCH, micro_batch_size=1),
        }
        dp_rank = parallel_state.get_data_parallel_rank()
        grads, counts = {}, {}
        for name, strategy in strategies.items():
            step = strategy.plan(rollout.total_lengths, rollout.group_ids).steps[0]
            packed = list(MicrobatchIterator(rollout, step.ranks[dp_rank], step=0, dp_rank=dp_rank))
            model.zero_grad(set_to_none=True)
            forward_backward(model, packed, global_loss_tokens(packed), 0.2, 0.28)
            allreduce_gradients(model)
            grads[name] = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            counts[name] = step.num_microbatches
        if dist.get_rank() == 0:
            torch.save({"grads": grads, "num_microbatches": counts}, out)
    finally:
        destroy_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
