"""Run megatron-core's pipeline schedules, p2p communication and DDP buffers on CPU (gloo).

Three megatron-core 0.16.1 modules place tensors on CUDA by hand: the schedules
(`total_num_tokens = torch.zeros(..., device="cuda")`, `torch.autocast("cuda")`), p2p
communication (`torch.cuda.current_device()` for shape tensors and receive buffers,
`torch.cuda.synchronize()`) and the DDP grad/param buffers (`torch.cuda.current_device()`).
`apply()` replaces the module-level name `torch` in exactly those three modules by a proxy that
maps those placements to the CPU; everything else the proxy forwards to torch unchanged.
Nothing else in torch or megatron is touched, and only the CPU trainer applies it.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

import torch

from slime_hydra.errors import SlimeHydraError

MEGATRON_VERSION = "0.16.1"
"""The megatron-core release whose CUDA call sites this shim was written against."""

PATCHED_MODULES = (
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.distributed.param_and_grad_buffer",
)

CPU = torch.device("cpu")


def _on_cpu(device: Any) -> Any:
    """A CUDA placement ("cuda", "cuda:N", a CUDA device) becomes the CPU; others stay."""
    if device is None:
        return None
    if torch.device(device).type == "cuda":
        return CPU
    return device


def _placed(factory: Any) -> Any:
    """torch.zeros/empty/tensor/... with its `device=` moved off CUDA."""

    def make(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return factory(*args, device=_on_cpu(device), **kwargs)

    return make


class _CpuCuda:
    """`torch.cuda` as the patched modules use it: the current device is the CPU."""

    @staticmethod
    def current_device() -> torch.device:
        return CPU

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """CPU ops are synchronous: nothing to wait for."""

    def __getattr__(self, name: str) -> Any:
        raise SlimeHydraError(
            f"megatron-core called torch.cuda.{name} on the CPU trainer, which the CPU shim "
            f"(slime_hydra/train/step/cpu_shim.py, written for megatron-core {MEGATRON_VERSION}) "
            "does not map; this megatron setting needs trainer=gpu."
        )


class _CpuTorch(types.ModuleType):
    """The `torch` module with CUDA placements mapped to the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _CpuCuda()
        for name in ("zeros", "empty", "ones", "tensor", "full"):
            setattr(self, name, _placed(getattr(torch, name)))

    @staticmethod
    def autocast(device_type: str, *args: Any, **kwargs: Any) -> torch.autocast:
        return torch.autocast("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def check_version() -> None:
    """Refuse any megatron-core other than the one whose call sites the shim maps."""
    from importlib.metadata import version

    found = version("megatron-core")
    if found != MEGATRON_VERSION:
        raise SlimeHydraError(
            f"trainer=cpu maps megatron-core {MEGATRON_VERSION}'s CUDA placements to the CPU "
            f"(slime_hydra/train/step/cpu_shim.py), but megatron-core {found} is installed: "
            f"install megatron-core=={MEGATRON_VERSION}, or re-check the shim's call sites for "
            f"{found}."
        )


def apply() -> None:
    """Patch the three modules (idempotent); fail loudly if megatron moved what it patches."""
    check_version()
    proxy = _CpuTorch()
    for name in PATCHED_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise SlimeHydraError(
                f"the CPU shim patches {name}, which megatron-core {MEGATRON_VERSION} has but "
                f"this install does not ({exc})."
            ) from None
        current = getattr(module, "torch", None)
        if current is not torch and not isinstance(current, _CpuTorch):
            raise SlimeHydraError(
                f"the CPU shim replaces {name}.torch, but that module has no attribute 'torch' "
                f"bound to the torch package: megatron-core {MEGATRON_VERSION}'s layout moved."
            )
        module.torch = proxy
