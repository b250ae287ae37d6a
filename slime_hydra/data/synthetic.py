"""Synthetic GRPO rollouts: prompts × samples, per-prompt difficulty, truncation at the max."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import available_memory

BYTES_PER_SAMPLE = 1024
"""Memory a planned sample takes, rounded up (lengths, ids, its place in the schedule and the
step metrics: about 200 bytes measured at 10⁵–10⁶ samples)."""


@dataclass(frozen=True)
class SyntheticGRPO:
    """Seeded GRPO-shaped lengths.

    Each prompt has a lognormal length and a lognormal difficulty shared by its group of
    `n_samples_per_prompt` samples; each response is lognormal around the prompt's difficulty
    times `response_len_median`, clipped at `max_response_len`, so truncated samples pile up
    there as they do in real rollouts.
    """

    num_prompts: int = 64
    n_samples_per_prompt: int = 8
    prompt_len_median: int = 512
    prompt_len_sigma: float = 0.5
    max_prompt_len: int = 1024
    response_len_median: int = 1024
    difficulty_sigma: float = 0.8
    sample_sigma: float = 0.5
    max_response_len: int = 3072
    seed: int = 1234

    def __post_init__(self) -> None:
        for name in (
            "num_prompts",
            "n_samples_per_prompt",
            "prompt_len_median",
            "max_prompt_len",
            "response_len_median",
            "max_response_len",
        ):
            if getattr(self, name) < 1:
                raise SlimeHydraError(
                    f"data.{name}={getattr(self, name)} must be a positive integer."
                )
        samples = self.num_prompts * self.n_samples_per_prompt
        available = available_memory()
        if available is not None and samples * BYTES_PER_SAMPLE > available:
            raise SlimeHydraError(
                f"data.num_prompts={self.num_prompts} × data.n_samples_per_prompt="
                f"{self.n_samples_per_prompt} = {samples} samples need about "
                f"{samples * BYTES_PER_SAMPLE / 2**30:.0f} GiB to plan (≈{BYTES_PER_SAMPLE} bytes "
                f"each), more than the {available / 2**30:.1f} GiB of memory available; lower "
                "data.num_prompts."
            )

    def load(self) -> RolloutBatch:
        """Draw the rollout: sample i belongs to prompt (group) i // n_samples_per_prompt."""
        rng = np.random.default_rng(self.seed)
        n = self.num_prompts * self.n_samples_per_prompt
        prompt = rng.lognormal(
            np.log(self.prompt_len_median), self.prompt_len_sigma, self.num_prompts
        )
        prompt = np.clip(prompt.astype(np.int64), 1, self.max_prompt_len)
        difficulty = rng.lognormal(0.0, self.difficulty_sigma, self.num_prompts)
        groups = np.repeat(np.arange(self.num_prompts), self.n_samples_per_prompt)
        response = rng.lognormal(
            np.log(self.response_len_median * difficulty[groups]), self.sample_sigma, n
        )
        response = np.clip(response.astype(np.int64), 1, self.max_response_len)
        return RolloutBatch(
            total_lengths=prompt[groups] + response,
            response_lengths=response,
            group_ids=groups,
        )
