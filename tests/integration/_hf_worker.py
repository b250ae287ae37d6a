"""torchrun worker for test_hf_models.py: HF Qwen2 weights in our GPTModel chunks on one layout.

Usage: torchrun --nproc-per-node N _hf_worker.py OUT TP PP VPP CP load CKPT [CKPT ...]
   or: torchrun --nproc-per-node N _hf_worker.py OUT TP PP VPP CP train CKPT ROLLOUTS
`load`: for each checkpoint in turn (in one process: tied and untied, in either order), build
the chunks, load the weights, save the packed (THD) logits of SEQUENCES as OUT/logits_I.pt
(where pp·cp allow a plain forward) and export the chunks to OUT/export_I.
`train`: the engine loads the checkpoint (its logits: OUT/logits_loaded.pt), trains two steps
on the text rollouts, saves its logits as OUT/logits_0.pt and exports to OUT/export_0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from slime_hydra.data.iterator import MicrobatchIterator
from slime_hydra.data.packing import thd_params
from slime_hydra.data.text import TextRollouts
from slime_hydra.hf.checks import model_dims
from slime_hydra.schedule import DynamicBatching, ParallelLayout
from slime_hydra.train.run.distributed import destroy_distributed, init_distributed, seed_everything
from slime_hydra.train.run.loop import rank_microbatches
from slime_hydra.train.step import cpu_shim
from slime_hydra.train.step.engine import MegatronEngine, PolicyLoss
from slime_hydra.train.step.hf_bridge import export_hf, load_hf_weights, load_into_engine, unwrap
from slime_hydra.train.step.model import build_model_chunks
from slime_hydra.train.step.optimizer import OptimizerSettings

SEED = 5
SEQUENCES = [[3, 17, 250, 9, 44, 101, 7, 7, 12, 299, 1, 64, 65], list(range(30, 51))]
"""Two packed sequences (lengths 13 and 21) with ids spread over the vocabulary."""


@torch.no_grad()
def packed_logits(chunks: list[torch.nn.Module], vocab: int) -> torch.Tensor | None:
    """Logits [T, vocab] of SEQUENCES packed as THD, through the virtual pipeline stages in
    order (p2p between PP ranks), gathered over TP; None on ranks without the last stage."""
    tokens = torch.tensor([[t for s in SEQUENCES for t in s]])
    positions = torch.tensor([[p for s in SEQUENCES for p in range(len(s))]])
    params = thd_params([0, len(SEQUENCES[0]), len(tokens[0])])
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    me = parallel_state.get_pipeline_model_parallel_rank()
    group = parallel_state.get_pipeline_model_parallel_group()
    hidden = chunks[0].config.hidden_size
    out = None
    stages = [(v, r) for v in range(len(chunks)) for r in range(pp)]
    for i, (v, r) in enumerate(stages):
        if r != me:
            continue
        model = chunks[v]
        if i > 0:
            buf = torch.empty(tokens.shape[1], 1, hidden)
            dist.recv(buf, src=dist.get_global_rank(group, stages[i - 1][1]))
            model.set_input_tensor(buf)
        out = model(tokens, positions, None, packed_seq_params=params)
        if i + 1 < len(stages):
            dist.send(out.contiguous(), dst=dist.get_global_rank(group, stages[i + 1][1]))
    if me != pp - 1:
        return None
    parts = [
        torch.empty_like(out) for _ in range(parallel_state.get_tensor_model_parallel_world_size())
    ]
    dist.all_gather(parts, out.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    logits = torch.cat(parts, dim=-1)  # the output layer is split over the vocabulary
    return logits[0, :, :vocab].clone()


def save_logits(out: Path, i: int | str, logits: torch.Tensor | None) -> None:
    first = parallel_state.get_tensor_model_parallel_rank() == 0
    if logits is not None and first and parallel_state.get_data_parallel_rank() == 0:
        torch.save(logits, out / f"logits_{i}.pt")


def load(out: Path, checkpoints: list[str], layout: ParallelLayout) -> None:
    for i, ckpt in enumerate(checkpoints):
        dims = model_dims({"name": "hf", "path": ckpt})
        chunks = build_model_chunks(
            dims,
            SEED,
            microbatch_group_size_per_vp_stage=layout.vp_group_size if layout.vpp > 1 else None,
        )
        load_hf_weights(chunks, dims)
        if layout.cp == 1:
            save_logits(out, i, packed_logits(chunks, dims.vocab_size))
        export_hf(chunks, dims, out / f"export_{i}")


def train(out: Path, ckpt: str, rollouts: str, layout: ParallelLayout) -> None:
    dims = model_dims({"name": "hf", "path": ckpt})
    engine = MegatronEngine(
        dims,
        layout,
        OptimizerSettings(lr=1e-2, weight_decay=0.0, clip_grad=1.0),
        PolicyLoss(),
        SEED,
    )
    load_into_engine(engine, dims)
    save_logits(out, "loaded", packed_logits(unwrap(engine.chunks), dims.vocab_size))
    batch = TextRollouts(rollouts, tokenizer=ckpt).load()
    strategy = DynamicBatching(layout, global_batch_size=4, max_tokens_per_gpu=96)
    schedule = strategy.plan(batch.total_lengths, batch.group_ids)
    losses = []
    for step in range(2):
        mbs = rank_microbatches(MicrobatchIterator, batch, schedule.steps[step])
        losses.append(engine.train_step(mbs))
    if dist.get_rank() == 0:
        mbs = [s.num_microbatches for s in schedule.steps]
        torch.save({"steps": losses, "num_microbatches": mbs}, out / "train.pt")
    chunks = unwrap(engine.chunks)
    save_logits(out, 0, packed_logits(chunks, dims.vocab_size))
    export_hf(engine.chunks, dims, out / "export_0")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    tp, pp, vpp, cp = (int(x) for x in sys.argv[2:6])
    mode, args = sys.argv[6], sys.argv[7:]
    layout = ParallelLayout(
        dp=int(os.environ["WORLD_SIZE"]) // (tp * pp * cp),
        tp=tp,
        pp=pp,
        vpp=vpp,
        cp=cp,
        microbatch_group_size_per_vp_stage=pp if vpp > 1 else 1,
    )
    cpu_shim.apply()
    init_distributed(tp, pp, cp, "gloo", vpp)
    try:
        seed_everything(SEED)
        if mode == "load":
            load(out, args, layout)
        else:
            train(out, args[0], args[1], layout)
    finally:
        destroy_distributed()
