"""train/step/shapes.py, which a resume checks checkpoints against before launch, gives every
rank the keys and shapes of the model chunks model.py builds: tied and untied embeddings,
LayerNorm, a plain MLP, kv_channels, on TP, PP with VPP, and DP×PP ranks, in the order of the
model's parameters (the order torch's optimizer pairs saved moments with parameters by)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integration.torchrun import torchrun

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("_shapes_worker.py")


@pytest.mark.parametrize(
    ("nproc", "tp", "pp", "vpp", "cp"),
    [(2, 2, 1, 1, 1), (2, 1, 2, 2, 1), (4, 1, 2, 1, 1)],
    ids=["tp2", "pp2_vpp2", "dp2_pp2"],
)
def test_weight_shapes_are_those_of_the_built_model(tmp_path, nproc, tp, pp, vpp, cp):
    torchrun(WORKER, nproc, str(tmp_path), str(tp), str(pp), str(vpp), str(cp), timeout=600)
    for rank in range(nproc):
        differ = torch.load(tmp_path / f"rank_{rank}.pt", weights_only=True)
        assert not any(differ.values()), (rank, differ)
