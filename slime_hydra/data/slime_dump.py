"""Rollout source that reads a file slime wrote with `--save-debug-rollout-data`.

Such a file is a `torch.save`d dict `{"rollout_id": int, "samples": [Sample.to_dict(), ...]}`.
Per sample we read `tokens`, `response_length`, `reward`, `group_index`, and when present
`loss_mask` (None means every response token, as in slime), `rollout_log_probs`, an
`advantages`/`advantage` field, and `remove_sample` (its loss mask is zeroed, as in slime).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import RolloutTokens
from slime_hydra.errors import SlimeHydraError

_MISSING = object()


@dataclass(frozen=True)
class SlimeDump:
    """A slime debug rollout dump on disk; `load()` turns it into a RolloutBatch with tokens."""

    path: str
    trust_pickle: bool = False
    """Allow full unpickling (can run arbitrary code): only for files you trust."""
    reward_key: str | None = None
    """Which entry of a dict-valued reward to train on."""

    def _read(self) -> object:
        """The file's object, unpickling arbitrary classes only when the user trusts the file."""
        if not Path(self.path).is_file():
            raise SlimeHydraError(
                f"slime dump {self.path!r} does not exist or is not a file; check data.path."
            )
        if self.trust_pickle:
            return torch.load(self.path, map_location="cpu", weights_only=False)
        try:
            return torch.load(self.path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as err:
            raise SlimeHydraError(
                f"slime dump {self.path!r} holds objects that only a full unpickler can rebuild, "
                "and unpickling can run arbitrary code. If you trust this file, set "
                f"data.trust_pickle=true. (torch.load said: {str(err).splitlines()[0]})"
            ) from err

    def _field(self, sample: Mapping, i: int, *names: str, default: object = _MISSING) -> object:
        """The first of `names` present (and not None) in sample i, else `default` or an error."""
        for name in names:
            value = sample.get(name)
            if value is not None:
                return value
        if default is _MISSING:
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} has no {' / '.join(names)!s} field "
                f"(it has: {', '.join(sorted(map(str, sample)))})."
            )
        return default

    def _reward(self, sample: Mapping, i: int) -> float:
        """Sample i's scalar reward, picking `reward_key` from a dict reward as slime does."""
        reward = self._field(sample, i, "reward")
        if isinstance(reward, Mapping):
            if self.reward_key is None or self.reward_key not in reward:
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {i} has a dict reward with keys "
                    f"{sorted(reward)}; name the one to train on with reward_key "
                    f"(got {self.reward_key!r})."
                )
            reward = reward[self.reward_key]
        return float(reward)

    def _per_response(self, values: object, response_length: int, i: int, name: str) -> np.ndarray:
        """`values` as a 1-D array of one entry per response token of sample i."""
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        if len(arr) != response_length:
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} has {len(arr)} {name} values for "
                f"response_length={response_length}."
            )
        return arr

    def load(self) -> RolloutBatch:
        """Read the dump into a RolloutBatch (global sample order = order in the file)."""
        obj = self._read()
        samples = obj.get("samples") if isinstance(obj, Mapping) else None
        if not isinstance(samples, list) or not samples:
            raise SlimeHydraError(
                f"slime dump {self.path!r} is not a slime debug rollout file: expected a dict "
                "with a non-empty 'samples' list (written by --save-debug-rollout-data)."
            )
        tokens, resp, masks, rewards, groups, advantages, logprobs = [], [], [], [], [], [], []
        for i, s in enumerate(samples):
            if not isinstance(s, Mapping):
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {i} is a {type(s).__name__}, not a dict."
                )
            tok = np.asarray(self._field(s, i, "tokens"), dtype=np.int64).reshape(-1)
            r = int(self._field(s, i, "response_length"))
            if not 0 <= r <= len(tok) or len(tok) == 0:
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {i} has response_length={r} "
                    f"for {len(tok)} tokens."
                )
            mask = self._per_response(
                self._field(s, i, "loss_mask", default=np.ones(r)), r, i, "loss_mask"
            )
            if s.get("remove_sample"):
                mask = np.zeros(r)
            adv = self._field(s, i, "advantages", "advantage", default=None)
            lp = self._field(s, i, "rollout_log_probs", default=None)
            tokens.append(tok)
            resp.append(r)
            masks.append(mask)
            rewards.append(self._reward(s, i))
            groups.append(int(self._field(s, i, "group_index", "group_id")))
            advantages.append(
                adv
                if adv is None or np.ndim(adv) == 0
                else self._per_response(adv, r, i, "advantages")
            )
            logprobs.append(
                None if lp is None else self._per_response(lp, r, i, "rollout_log_probs")
            )
        have_adv = [a is not None for a in advantages]
        have_lp = [lp is not None for lp in logprobs]
        for name, have in (("advantages", have_adv), ("rollout_log_probs", have_lp)):
            if any(have) and not all(have):
                j = have.index(not have[0])
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {j} {'lacks' if have[0] else 'has'} "
                    f"{name} but sample 0 {'has it' if have[0] else 'does not'}; "
                    "all samples or none must carry it."
                )
        return RolloutTokens.from_samples(
            tokens=tokens,
            response_lengths=resp,
            loss_masks=masks,
            rewards=rewards,
            group_ids=groups,
            advantages=advantages if all(have_adv) else None,
            old_logprobs=logprobs if all(have_lp) else None,
        ).to_batch()
