"""Rollout source that reads a file slime wrote with `--save-debug-rollout-data`.

Such a file is a `torch.save`d dict `{"rollout_id": int, "samples": [Sample.to_dict(), ...]}`.
Per sample we read `tokens`, `response_length`, `reward`, `group_index`, and when present
`loss_mask` (None means every response token, as in slime), `rollout_log_probs`, an
`advantages`/`advantage` field, and `remove_sample` (its loss mask is zeroed, as in slime).
Every field is checked as read, naming the sample, the value and what was expected: tokens and
per-token values are 1-D (never flattened), rewards are finite scalars, group ids integers
(never rounded), so a malformed dump stops before anything is planned.
"""

from __future__ import annotations

import pickle
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from slime_hydra.data.rollout import RolloutBatch
from slime_hydra.data.tokens import RolloutTokens
from slime_hydra.errors import SlimeHydraError

_MISSING = object()


def _is_tensor(value: object) -> bool:
    """A torch.Tensor; without torch imported (it is, by `_read`) nothing can be one."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _bool() -> object:
    """torch.bool (torch is imported by then: `_is_tensor` was true)."""
    return sys.modules["torch"].bool


@dataclass(frozen=True)
class SlimeDump:
    """A slime debug rollout dump on disk; `load()` turns it into a RolloutBatch with tokens."""

    path: str
    trust_pickle: bool = False
    """Full unpickling, which runs whatever code the file names: only for a file you wrote.
    By default the file loads weights-only, an allowlist of tensors and plain containers."""
    reward_key: str | None = None
    """Which entry of a dict-valued reward to train on."""

    def _read(self) -> object:
        """The file's object through torch's weights-only allowlist (tensors, numbers, strings,
        lists, dicts); anything the file names beyond it is refused, not loaded, unless the user
        asked for full unpickling."""
        if not Path(self.path).is_file():
            raise SlimeHydraError(
                f"slime dump {self.path!r} does not exist or is not a file; check data.path."
            )
        import torch  # here, not at the top: composing configs and --help stay torch-free

        try:
            return torch.load(self.path, map_location="cpu", weights_only=not self.trust_pickle)
        except pickle.UnpicklingError as err:
            needs = re.search(r"GLOBAL ([\w.]+)", str(err))
            if needs is None or self.trust_pickle:
                raise self._unreadable(err) from None
            raise SlimeHydraError(
                f"slime dump {self.path!r} names {needs.group(1)}, which is not a tensor or a "
                "plain container (numbers, strings, lists, dicts): unpickling it would call it, "
                "so nothing of the file was loaded or run. A rollout dump needs nothing else; "
                "regenerate it with slime's --save-debug-rollout-data."
            ) from None
        except Exception as err:  # torch raises RuntimeError/EOFError/... for a damaged file
            raise self._unreadable(err) from None

    def _unreadable(self, err: Exception) -> SlimeHydraError:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return SlimeHydraError(
            f"slime dump {self.path!r} is not a readable torch.save file (truncated or damaged? "
            f"{type(err).__name__}: {first}). Regenerate it with slime's "
            "--save-debug-rollout-data; data.trust_pickle does not repair a damaged file."
        )

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
        return self._finite_scalar(reward, i, "reward")

    def _array(self, values: object, i: int, name: str, dtype: type | None) -> np.ndarray:
        """`values` (a tensor or sequence) as a numpy array of `dtype` (None: as it is), or an
        error naming the field."""
        if _is_tensor(values):
            values = values.detach().cpu().numpy()
        try:
            arr = np.asarray(values)
            if arr.dtype == object or arr.dtype.kind in "USV":
                raise TypeError(f"holds {arr.dtype} values")
            return arr if dtype is None else arr.astype(dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} {name} is not numeric ({exc})."
            ) from None

    def _finite_scalar(self, value: object, i: int, name: str) -> float:
        """A single finite number (a Python/numpy number or one-element 0-d tensor)."""
        if isinstance(value, bool | np.bool_) or (_is_tensor(value) and value.dtype is _bool()):
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} {name}={value!r} is a boolean; expected a "
                "number (write True/False rewards as 1.0/0.0)."
            )
        arr = self._array(value, i, name, np.float64)
        if arr.ndim != 0:
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} {name} has shape {list(arr.shape)}; "
                "expected a scalar (a dict reward needs data.reward_key)."
            )
        if not np.isfinite(arr):
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} {name}={float(arr)} is not finite; "
                "training on it would turn the loss and the weights into NaN. Fix or drop the "
                "sample in the rollout."
            )
        return float(arr)

    def _integer(self, value: object, i: int, name: str) -> int:
        """An integer scalar (Python, numpy or 0-d integer tensor); floats are not rounded."""
        if _is_tensor(value) and value.ndim == 0 and not value.is_floating_point():
            value = value.item()
        if isinstance(value, np.generic) and np.issubdtype(type(value), np.integer):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} {name}={value!r} is not an integer "
                "(group ids and lengths are never rounded, so 0.3 and 0.7 cannot merge)."
            )
        return value

    def _per_response(self, values: object, response_length: int, i: int, name: str) -> np.ndarray:
        """`values` as a 1-D array of one finite entry per response token of sample i."""
        arr = self._array(values, i, name, np.float64)
        if arr.ndim != 1:
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} {name} has shape {list(arr.shape)}; "
                f"expected 1-D, one value per response token ({response_length})."
            )
        if not np.all(np.isfinite(arr)):
            j = int(np.flatnonzero(~np.isfinite(arr))[0])
            raise SlimeHydraError(
                f"slime dump {self.path!r}: sample {i} {name}[{j}]={arr[j]} is not finite; fix or "
                "drop the sample in the rollout."
            )
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
            tok = self._array(self._field(s, i, "tokens"), i, "tokens", None)
            if tok.ndim != 1:
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {i} tokens has shape {list(tok.shape)}; "
                    "expected 1-D, one id per token (it is not flattened)."
                )
            integral = tok.dtype.kind in "iu" or (
                tok.dtype.kind == "f" and bool(np.all(tok == np.round(tok)))
            )
            if not integral or (tok.size and tok.min() < 0):
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {i} tokens are not non-negative integer "
                    f"ids (dtype {tok.dtype}, min {tok.min() if tok.size else None})."
                )
            tok = tok.astype(np.int64)
            r = self._integer(self._field(s, i, "response_length"), i, "response_length")
            if not 0 <= r <= len(tok) or len(tok) == 0:
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {i} has response_length={r} "
                    f"for {len(tok)} tokens."
                )
            mask = self._per_response(
                self._field(s, i, "loss_mask", default=np.ones(r)), r, i, "loss_mask"
            )
            if not np.isin(mask, (0.0, 1.0)).all():
                j = int(np.flatnonzero(~np.isin(mask, (0.0, 1.0)))[0])
                raise SlimeHydraError(
                    f"slime dump {self.path!r}: sample {i} loss_mask[{j}]={mask[j]} is not 0 or 1; "
                    "a loss mask selects response tokens, it does not weight them."
                )
            if s.get("remove_sample"):
                mask = np.zeros(r)
            adv = self._field(s, i, "advantages", "advantage", default=None)
            lp = self._field(s, i, "rollout_log_probs", default=None)
            tokens.append(tok)
            resp.append(r)
            masks.append(mask)
            rewards.append(self._reward(s, i))
            groups.append(self._integer(self._field(s, i, "group_index", "group_id"), i, "group"))
            if adv is not None and np.ndim(adv) == 0:
                adv = self._finite_scalar(adv, i, "advantage")
            elif adv is not None:
                adv = self._per_response(adv, r, i, "advantages")
            advantages.append(adv)
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
        data = RolloutTokens.from_samples(
            tokens=tokens,
            response_lengths=resp,
            loss_masks=masks,
            rewards=rewards,
            group_ids=groups,
            advantages=advantages if all(have_adv) else None,
            old_logprobs=logprobs if all(have_lp) else None,
        )
        return RolloutBatch.from_tokens(data)
