"""The CPU shim: megatron-core 0.16.1's CUDA call sites in the three patched modules are exactly
the ones it maps, its proxy places them on the CPU, and anything else fails loudly."""

from __future__ import annotations

import collections
import importlib
import inspect
import re

import pytest
import torch

from slime_hydra.errors import SlimeHydraError
from slime_hydra.train.step import cpu_shim

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU shim is for hosts without CUDA"
)

CUDA_SITE = re.compile(
    r"torch\.cuda\.[A-Za-z_]+|device=[\"']cuda[\"']|torch\.autocast\(\s*[\"']cuda[\"']|\.cuda\("
)

# Every CUDA site in the patched modules of megatron-core 0.16.1, read off its source. The
# streams (param_and_grad_buffer) are used only with overlap_grad_reduce, which the engine
# leaves off; on CPU they would raise the shim's error.
PINNED = {
    "megatron.core.pipeline_parallel.schedules": {'torch.autocast("cuda"': 1, 'device="cuda"': 3},
    "megatron.core.pipeline_parallel.p2p_communication": {
        "torch.cuda.current_device": 6,
        "torch.cuda.synchronize": 2,
    },
    "megatron.core.distributed.param_and_grad_buffer": {
        "torch.cuda.stream": 1,
        "torch.cuda.default_stream": 2,
        'device="cuda"': 1,
        "torch.cuda.current_device": 3,
    },
}


@pytest.mark.parametrize("name", cpu_shim.PATCHED_MODULES)
def test_megatron_cuda_call_sites_are_the_pinned_ones(name: str) -> None:
    source = inspect.getsource(importlib.import_module(name))
    assert dict(collections.Counter(CUDA_SITE.findall(source))) == PINNED[name]


def test_the_proxy_places_cuda_tensors_on_the_cpu() -> None:
    proxy = cpu_shim._CpuTorch()
    assert proxy.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
    current = proxy.cuda.current_device()
    assert proxy.empty((3,), device=current, dtype=torch.int64).device.type == "cpu"
    assert proxy.tensor([1, 2], device="cuda:0").tolist() == [1, 2]
    assert proxy.cuda.synchronize() is None
    with proxy.autocast("cuda", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
    assert proxy.float32 is torch.float32 and proxy.distributed is torch.distributed


def test_an_unmapped_cuda_call_names_the_attribute() -> None:
    with pytest.raises(SlimeHydraError, match=r"torch\.cuda\.default_stream.*trainer=gpu"):
        cpu_shim._CpuTorch().cuda.default_stream()


def test_apply_patches_the_three_modules_and_nothing_else() -> None:
    cpu_shim.apply()
    cpu_shim.apply()  # idempotent
    for name in cpu_shim.PATCHED_MODULES:
        assert isinstance(importlib.import_module(name).torch, cpu_shim._CpuTorch)
    for name in ("megatron.core.optimizer.optimizer", "megatron.core.tensor_parallel.layers"):
        assert importlib.import_module(name).torch is torch


def test_another_megatron_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "version", lambda _: "0.17.0")
    with pytest.raises(SlimeHydraError, match=r"megatron-core 0\.16\.1.*0\.17\.0 is installed"):
        cpu_shim.apply()
