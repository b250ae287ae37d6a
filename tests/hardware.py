"""Hardware needs in one place (lightning-hydra-template's RunIf): a test that needs CUDA skips
on a CPU host, and a test that asserts the refusal of a host without enough GPUs (or without
Transformer Engine) skips on a host that has them."""

from __future__ import annotations

import functools

import pytest


@functools.cache
def cuda_devices() -> int:
    """CUDA devices this host has (0 without CUDA); torch is imported on first use only."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_cuda(count: int = 1) -> None:
    """Skip the calling test unless this host has `count` CUDA devices."""
    if cuda_devices() < count:
        pytest.skip(f"needs {count} CUDA device(s), this host has {cuda_devices()}")


def needs_fewer_cuda_than(count: int) -> None:
    """Skip the calling test (which asserts what happens without `count` GPUs) on a host that
    has `count` or more CUDA devices."""
    if cuda_devices() >= count:
        pytest.skip(f"asserts a host with fewer than {count} CUDA devices; this one has more")


def needs_no_transformer_engine() -> None:
    """Skip the calling test (which asserts what happens without Transformer Engine) on a host
    where megatron-core can build TE layers."""
    from slime_hydra.train.step.model import has_transformer_engine

    if has_transformer_engine():
        pytest.skip("asserts a host without Transformer Engine; this one has it")
