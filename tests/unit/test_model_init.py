"""The model build (train/step/model.py): megatron draws no weight that `init_weights` draws again,
and still builds what init_weights leaves (tensor-parallel attributes, zero biases, unit
norms); the weights depend on the seed alone; cu_seqlens go where the layers read them."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu.figures import load_dims
from slime_hydra.train.step.model import build_gpt_model, init_weights, seq_params_device
from tests.hardware import needs_no_transformer_engine
from tests.single_rank import single_rank


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    with single_rank():
        yield


def test_megatron_draws_no_weight_while_building():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    model = build_gpt_model(load_dims("tiny"))  # CPU initialisation draws from this RNG
    assert torch.equal(torch.get_rng_state(), before)
    qkv = model.decoder.layers[0].self_attention.linear_qkv
    assert qkv.weight.tensor_model_parallel and qkv.weight.partition_dim == 0
    assert model.embedding.word_embeddings.weight.tensor_model_parallel
    assert not qkv.bias.any()
    assert bool((model.decoder.final_layernorm.weight == 1).all())


def test_init_weights_depends_on_the_seed_alone():
    dims = load_dims("tiny")
    states = []
    for torch_seed in (0, 1):
        torch.manual_seed(torch_seed)
        model = build_gpt_model(dims)
        init_weights([model], dims, seed=7)
        states.append({n: p.detach().clone() for n, p in model.named_parameters()})
    first, second = states
    assert all(torch.equal(first[n], second[n]) for n in first)
    qkv = first["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert 0.015 < float(qkv.std()) < 0.025  # normal(0, 0.02)


def test_local_layers_read_cu_seqlens_on_the_host():
    needs_no_transformer_engine()
    assert seq_params_device("cuda") is None
    assert seq_params_device("cpu") is None
