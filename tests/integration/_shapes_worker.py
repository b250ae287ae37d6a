"""torchrun worker for test_weight_shapes.py: build model chunks of several model variants on
one layout and save, per rank, the keys where their named_parameters() (keys, shapes and
order) and train/step/shapes.py differ, and tensors of the state_dict that are not parameters.

Usage: torchrun --nproc-per-node N _shapes_worker.py OUT_DIR TP PP VPP CP
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from slime_hydra.schedule import ParallelLayout
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.run.distributed import destroy_distributed, init_distributed
from slime_hydra.train.step import cpu_shim
from slime_hydra.train.step.model import build_model_chunks
from slime_hydra.train.step.shapes import weight_shapes

BASE = ModelDims("shapes", 4, 64, 96, 4, 2, 300, 512, add_qkv_bias=True)
VARIANTS = {
    "untied": BASE,
    "tied": dataclasses.replace(BASE, untie_embeddings_and_output_weights=False),
    "layernorm_gelu_no_bias": dataclasses.replace(
        BASE, normalization="LayerNorm", swiglu=False, add_qkv_bias=False
    ),
    "kv_channels": dataclasses.replace(BASE, kv_channels=24),
}


def main(out: Path, tp: int, pp: int, vpp: int, cp: int) -> None:
    cpu_shim.apply()
    init_distributed(tp, pp, cp, "gloo", vpp)
    try:
        rank = dist.get_rank()
        dp = dist.get_world_size() // (tp * pp * cp)
        layout = ParallelLayout(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp)
        differ = {}
        for name, dims in VARIANTS.items():
            chunks = torch.nn.ModuleList(build_model_chunks(dims, seed=1))
            built = [(k, tuple(v.shape)) for k, v in chunks.named_parameters()]
            tensors = {k for k, v in chunks.state_dict().items() if isinstance(v, torch.Tensor)}
            expected = list(weight_shapes(dims, layout, rank).items())
            differ[name] = sorted(set(built) ^ set(expected)) or [
                (i, b, e) for i, (b, e) in enumerate(zip(built, expected, strict=True)) if b != e
            ]
            differ[f"{name} state_dict"] = sorted(tensors ^ {k for k, _ in built})
        torch.save(differ, out / f"rank_{rank}.pt")
    finally:
        destroy_distributed()


if __name__ == "__main__":
    main(Path(sys.argv[1]), *(int(x) for x in sys.argv[2:6]))
