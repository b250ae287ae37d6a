"""The model build (train/model.py): megatron's own initialisation is off, `init_weights` sets
every parameter (whatever memory megatron left there) from the seed alone, and cu_seqlens go
where the layers read them."""

from __future__ import annotations

import pytest
import torch

from slime_hydra.train.model import (
    build_gpt_model,
    init_weights,
    seq_params_device,
    transformer_config,
)
from tests.hardware import needs_no_transformer_engine
from tests.single_rank import single_rank
from tests.unit.test_gpu_check import gc


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    with single_rank():
        yield


def test_megatron_does_not_draw_weights_that_init_weights_overwrites():
    assert transformer_config(gc.load_dims("tiny")).perform_initialization is False


def test_init_weights_sets_every_parameter_from_the_seed_alone():
    dims = gc.load_dims("tiny")  # QKV bias, RMSNorm
    states = []
    for torch_seed in (0, 1):
        torch.manual_seed(torch_seed)
        model = build_gpt_model(dims)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(float("nan"))  # what uninitialised memory may hold
        init_weights([model], dims, seed=7)
        states.append({n: p.detach().clone() for n, p in model.named_parameters()})
    first, second = states
    assert first.keys() == second.keys()
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert all(torch.isfinite(p).all() for p in first.values())
    biases = [n for n in first if n.endswith("bias")]
    norms = [n for n in first if first[n].dim() == 1 and not n.endswith("bias")]
    assert biases == [f"decoder.layers.{i}.self_attention.linear_qkv.bias" for i in (0, 1)]
    assert len(norms) == 2 * dims.num_layers + 1  # two per layer and the final norm
    assert all(not first[n].any() for n in biases)
    assert all(bool((first[n] == 1).all()) for n in norms)
    qkv = first["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert 0.015 < float(qkv.std()) < 0.025  # normal(0, 0.02)


def test_local_layers_read_cu_seqlens_on_the_host():
    needs_no_transformer_engine()
    assert seq_params_device("cuda") is None
    assert seq_params_device("cpu") is None
