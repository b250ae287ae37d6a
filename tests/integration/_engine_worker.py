"""torchrun worker for test_engine_layouts.py: the engine's gradients and steps on one layout.

Usage: torchrun --nproc-per-node N _engine_worker.py OUT_DIR LAYERS CAP DP TP PP VPP G CP
   or: torchrun --nproc-per-node 1 _engine_worker.py OUT_DIR LAYERS reference
The reference computes the same values without the engine: one sample at a time, a plain
backward, a hand-written clipped AdamW step.
Each rank writes OUT_DIR/rank_R.pt: its gradient shards by global parameter name, the
micro-batch counts, the train/* values of two optimizer steps, and the shapes of the engine's
state_dict (what a checkpoint saves) beside those train/step/shapes.py expects.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from omegaconf import OmegaConf

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.data.rollout import RolloutBatch, with_tokens
from slime_hydra.data.synthetic import SyntheticGRPO
from slime_hydra.schedule import DynamicBatching, ParallelLayout, Schedule
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.run.distributed import destroy_distributed, init_distributed, seed_everything
from slime_hydra.train.run.loop import rank_microbatches
from slime_hydra.train.step import cpu_shim
from slime_hydra.train.step.engine import TENSORS, MegatronEngine, PolicyLoss
from slime_hydra.train.step.model import build_model_chunks, global_name
from slime_hydra.train.step.optimizer import OptimizerSettings, no_weight_decay
from slime_hydra.train.step.shapes import weight_shapes

REPO = Path(__file__).resolve().parents[2]
SEED = 1234
OPTIMIZER = OptimizerSettings(lr=1e-3, weight_decay=0.1, clip_grad=0.05)


def rollout() -> RolloutBatch:
    """16 short GRPO samples in 2 steps of 8, with tokens."""
    source = SyntheticGRPO(
        num_prompts=4,
        n_samples_per_prompt=4,
        prompt_len_median=24,
        max_prompt_len=60,
        response_len_median=48,
        max_response_len=150,
        seed=11,
    )
    return with_tokens(source.load(), vocab_size=256, seed=7)


def dims(num_layers: int) -> ModelDims:
    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf/model/tiny.yaml"))
    return ModelDims.from_mapping({**cfg, "num_layers": num_layers})


def plan(batch: RolloutBatch, layout: ParallelLayout, cap: int) -> Schedule:
    """Two steps of 8 samples (the same samples for every layout and cap)."""
    strategy = DynamicBatching(layout, global_batch_size=8, max_tokens_per_gpu=cap)
    return strategy.plan(batch.total_lengths, batch.group_ids)


def grad_shards(chunks: list[torch.nn.Module], tied: bool) -> dict[str, tuple]:
    """{global name: (tp rank, partition dim or None, gradient)} of this rank's parameters."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    out = {}
    for chunk in chunks:
        model = getattr(chunk, "module", chunk)
        for name, p in model.named_parameters():
            if getattr(p, "shared", False):
                continue  # the last stage's copy of a tied embedding
            grad = p.main_grad if hasattr(p, "main_grad") else p.grad
            dim = p.partition_dim if getattr(p, "tensor_model_parallel", False) else None
            out[global_name(name, model, tied)] = (tp_rank, dim, grad.detach().clone())
    return out


def engine_run(out_dir: Path, layout: ParallelLayout, num_layers: int, cap: int) -> None:
    cpu_shim.apply()
    init_distributed(layout.tp, layout.pp, layout.cp, "gloo", layout.vpp)
    try:
        seed_everything(SEED)
        model_dims = dims(num_layers)
        engine = MegatronEngine(model_dims, layout, OPTIMIZER, PolicyLoss(), SEED)
        batch = rollout()
        schedule = plan(batch, layout, cap)
        dp_rank = parallel_state.get_data_parallel_rank()

        def microbatches(step: int) -> MicrobatchIterator:
            return rank_microbatches(MicrobatchIterator, batch, schedule.steps[step])

        tied = not model_dims.untie_embeddings_and_output_weights
        result: dict = {
            "dp_rank": dp_rank,
            "cp_rank": parallel_state.get_context_parallel_rank(),
            "num_microbatches": [st.num_microbatches for st in schedule.steps],
            "grads": [],
            "weight_shapes": {
                k: tuple(v.shape)
                for k, v in engine.model.state_dict().items()
                if isinstance(v, torch.Tensor)
            },
            "expected_shapes": weight_shapes(model_dims, layout, dist.get_rank()),
        }
        for step in range(len(schedule.steps)):
            engine.forward_backward(microbatches(step))
            result["grads"].append(grad_shards(engine.chunks, tied))
        result["steps"] = [engine.train_step(microbatches(s)) for s in range(len(schedule.steps))]
        torch.save(result, out_dir / f"rank_{dist.get_rank()}.pt")
    finally:
        destroy_distributed()


def reference_run(out_dir: Path, num_layers: int) -> None:
    """One process, no megatron schedule or DDP: a sample per forward, loss over the step's
    loss tokens, then clipping and AdamW written out by hand."""
    init_distributed()
    try:
        seed_everything(SEED)
        model_dims = dims(num_layers)
        (model,) = build_model_chunks(model_dims, SEED)
        named = list(model.named_parameters())
        decay = [p for n, p in named if not no_weight_decay(n, p)]
        other = [p for n, p in named if no_weight_decay(n, p)]
        optimizer = torch.optim.AdamW(
            [{"params": decay}, {"params": other, "weight_decay": 0.0}],
            lr=OPTIMIZER.lr,
            weight_decay=OPTIMIZER.weight_decay,
        )
        batch = rollout()
        schedule = plan(batch, ParallelLayout(), cap=max(batch.total_lengths))
        tied = not model_dims.untie_embeddings_and_output_weights

        def backward(step: int) -> float:
            samples = schedule.steps[step].samples
            packed = [
                next(iter(MicrobatchIterator(batch, [[i]], step=step, dp_rank=0, pad_multiple=1)))
                for i in samples
            ]
            total = sum(mb.num_loss_tokens for mb in packed)
            model.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for mb in packed:
                params = mb.packed_seq_params()
                logits = model(mb.tokens, mb.position_ids, None, packed_seq_params=params)
                tensors = {name: getattr(mb, name) for name in TENSORS}
                loss, _, _ = PolicyLoss()(tensors, logits)
                (loss / total).backward()
                loss_sum += loss.item() / total
            return loss_sum

        result: dict = {"dp_rank": 0, "cp_rank": 0, "grads": []}
        for step in range(len(schedule.steps)):
            backward(step)
            result["grads"].append(grad_shards([model], tied))
        steps = []
        for step in range(len(schedule.steps)):
            loss = backward(step)
            norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters()))
            if norm > OPTIMIZER.clip_grad:
                for p in model.parameters():
                    p.grad.mul_(OPTIMIZER.clip_grad / (float(norm) + 1e-6))
            optimizer.step()
            steps.append({"loss": loss, "grad_norm": float(norm)})
        result["steps"] = steps
        torch.save(result, out_dir / "rank_0.pt")
    finally:
        destroy_distributed()


if __name__ == "__main__":
    out, num_layers = Path(sys.argv[1]), int(sys.argv[2])
    if sys.argv[3:] == ["reference"]:
        reference_run(out, num_layers)
    else:
        cap, dp, tp, pp, vpp, g, cp = (int(x) for x in sys.argv[3:10])
        layout = ParallelLayout(
            dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, microbatch_group_size_per_vp_stage=g
        )
        engine_run(out, layout, num_layers, cap)
