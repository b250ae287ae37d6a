"""What the step loop needs from a backend: one optimizer step over a rank's micro-batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from slime_hydra.data.iterator import MicrobatchIterator

MicrobatchSource = Callable[[], MicrobatchIterator]
"""Makes a fresh iterator over this rank's micro-batches of the step (VPP wants one per chunk)."""


@dataclass(frozen=True)
class StepResult:
    """Global values of one optimizer step, the same on every rank."""

    loss: float
    """Policy loss: a token mean over the whole global batch."""
    grad_norm: float
    """Global gradient norm before clipping."""
    lr: float
    clipfrac: float
    approx_kl: float

    def metrics(self) -> dict[str, float]:
        """The train/* metrics of DESIGN.md (and the PPO diagnostics)."""
        return {
            "train/loss": self.loss,
            "train/grad_norm": self.grad_norm,
            "train/lr": self.lr,
            "train/clipfrac": self.clipfrac,
            "train/approx_kl": self.approx_kl,
        }


class Engine(Protocol):
    """A model and optimizer on some device, trained one step at a time."""

    model: torch.nn.Module
    optimizer: Any
    pad_multiple: int | None
    """Packed length multiple for MicrobatchIterator (None: its default, tp × 128)."""

    def train_step(self, microbatches: MicrobatchSource) -> StepResult:
        """Forward and backward over the micro-batches, reduce gradients, step the optimizer."""
        ...
