"""Checkpoints in <run dir>/checkpoints: one file per rank per saved step, and `latest`.

`step_NNNNNN/rank_RRR.pt` holds that rank's model and optimizer state, its RNG state, the
number of steps done (NNNNNN), a digest of the schedule, the loop's counters, its identity (the
rank, the parallel layout and the model's dims) and the shape of every tensor it holds. Before
any worker starts, a resume refuses a file of another rank (two rank files swapped), layout or
model, and one whose tensors differ from the shapes it recorded (edited after saving) or from
the shapes this run's model gives that rank (train/step/shapes.py), weights this model does
not have, an optimizer state of another kind than this run's optimizer loads (torch's, or
megatron's with fp32 master copies for bf16/fp16), optimizer moments or master copies of
another shape than the weight torch pairs them with (by position in the model's parameter
order, whatever the order of the file's keys), and RNG states that do not restore. `latest` names
the last step all ranks finished saving, so a worker killed mid-save leaves the previous
checkpoint in force.

Files hold tensors and plain containers only and load with `torch.load(weights_only=True)`, so
a crafted checkpoint cannot run code. An optimizer state entry that is neither (megatron's
optimizer may keep config objects there) is left out on save and taken from the freshly built
optimizer on load; `dropped` in the file lists where.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from slime_hydra.errors import SlimeHydraError
from slime_hydra.files import make_dirs, parse_count, write_file
from slime_hydra.schedule import ParallelLayout, Schedule
from slime_hydra.schedule.cost import ModelDims
from slime_hydra.train.step.shapes import fixed_by, weight_shapes

FORMAT = 4
"""Bumped when the file layout changes; version 1 files were full pickles (not loadable),
version 2 files lack the identity (rank, layout, model) that version 3 records, and version 3
files lack the tensor shapes that version 4 records."""

OLD_FORMATS = {
    2: "it records no rank, layout or model",
    3: "it records no tensor shapes",
}
"""What a file of an older format lacks, so that a resume cannot check it before launch."""

IDENTITY_DIMS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "vocab_size",
    "kv_channels",
)
"""The model dims that fix the shapes of a rank's weights."""

HYPERPARAMETERS = ("lr", "weight_decay", "max_lr", "min_lr")
"""Optimizer param-group values the run's config sets: a resume keeps the new config's."""

_PLAIN = (bool, int, float, str, bytes, type(None), torch.Tensor, torch.dtype, torch.Size)

Path_ = tuple[Any, ...]


def checkpoint_root(run_dir: Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(run_dir) / "checkpoints"


def rank_file(run_dir: Path, steps_done: int, rank: int) -> Path:
    """The file of `rank`'s state after `steps_done` steps."""
    return checkpoint_root(run_dir) / f"step_{steps_done:06d}" / f"rank_{rank:03d}.pt"


def schedule_digest(schedule: Schedule) -> str:
    """A short fingerprint of the schedule, so a resume can refuse a different one."""
    return hashlib.sha256(json.dumps(schedule.to_json()).encode()).hexdigest()[:16]


def identity(layout: ParallelLayout, dims: ModelDims) -> dict[str, Any]:
    """What a rank file must match besides its rank: the layout's sizes and the model's dims."""
    model = {k: v for k, v in dataclasses.asdict(dims).items() if k in IDENTITY_DIMS}
    return {"layout": dataclasses.asdict(layout), "dims": model}


def latest_step(run_dir: Path) -> int | None:
    """Steps done at the last complete checkpoint, or None when there is none."""
    path = checkpoint_root(run_dir) / "latest"
    if os.path.lexists(path.parent) and not path.parent.is_dir():
        raise SlimeHydraError(
            f"{path.parent} is not a directory, so it holds no checkpoints: it must be the dir "
            "the run saves them in. Move it away (and restore the checkpoints dir to resume), or "
            "start a new run dir."
        )
    if not path.exists():
        return None
    if path.is_file():
        with path.open("rb") as f:
            data = f.read(64)  # a count is a few digits: never the whole of a damaged file
    else:
        data = b"(not a file)"
    text = data.decode(errors="replace").strip()
    count = parse_count(text)
    if count is None or count < 1:
        raise SlimeHydraError(
            f"{path} holds {text!r}, not a step count: it should name the last complete "
            f"checkpoint (a step_NNNNNN dir under {path.parent}). Write that number into it, "
            "or remove the checkpoints dir to start over."
        )
    return count


def plain(obj: Any, where: Path_ = (), dropped: list[Path_] | None = None) -> Any:
    """`obj` with only tensors, numbers, strings and dicts/lists/tuples of them; anything else
    is left out and its path appended to `dropped`."""
    if isinstance(obj, _PLAIN):
        return obj
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str | int):
                raise SlimeHydraError(f"checkpoint: state key {key!r} at {where} is not plain")
            kept = plain(value, (*where, key), dropped)
            if kept is not _DROPPED:
                out[key] = kept
        return out
    if isinstance(obj, list | tuple):
        inner: list[Path_] = []
        items = [plain(v, (*where, i), inner) for i, v in enumerate(obj)]
        if any(v is _DROPPED for v in items):  # keep positions: take the whole sequence on load
            if dropped is not None:
                dropped.append(where)
            return _DROPPED
        if dropped is not None:
            dropped.extend(inner)
        return list(items) if isinstance(obj, list) else tuple(items)
    if dropped is not None:
        dropped.append(where)
    return _DROPPED


_DROPPED = object()


def tensor_shapes(obj: Any, where: str = "") -> dict[str, list[int]]:
    """{"model/<key>" or "optimizer/state/<i>/<name>": shape} of every tensor in `obj`."""
    if isinstance(obj, torch.Tensor):
        return {where: list(obj.shape)}
    if not isinstance(obj, Mapping | list | tuple):
        return {}
    out: dict[str, list[int]] = {}
    for key, value in obj.items() if isinstance(obj, Mapping) else enumerate(obj):
        out |= tensor_shapes(value, f"{where}/{key}" if where else str(key))
    return out


def _get(obj: Any, where: Path_) -> Any:
    for key in where:
        obj = obj[key]
    return obj


def _put(obj: Any, where: Path_, value: Any) -> None:
    _get(obj, where[:-1])[where[-1]] = value


def save(
    run_dir: Path,
    steps_done: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: Any,
    digest: str,
    ident: Mapping[str, Any],
    counters: Mapping[str, int] | None = None,
) -> None:
    """Save this rank's state after `steps_done` steps (every rank, before `mark_latest`);
    `ident` is `identity(layout, dims)` of the run."""
    from slime_hydra.train.step.optimizer import checkpoint_state

    path = rank_file(run_dir, steps_done, rank)
    make_dirs(path.parent, run_dir)
    weights = model.state_dict()
    not_tensors: list[Path_] = []
    plain(weights, ("model",), not_tensors)
    if not_tensors:
        raise SlimeHydraError(f"checkpoint: the model state holds a non-tensor at {not_tensors[0]}")
    dropped: list[Path_] = []
    state = {
        "format": FORMAT,
        "steps_done": steps_done,
        "schedule": digest,
        "rank": rank,
        **ident,
        "counters": dict(counters or {}),
        "model": weights,
        "optimizer": plain(checkpoint_state(optimizer), (), dropped),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "dropped": [list(p) for p in dropped],
    }
    state["shapes"] = tensor_shapes({"model": weights, "optimizer": state["optimizer"]})
    write_file(path, lambda f: torch.save(state, f), run_dir)


def mark_latest(run_dir: Path, steps_done: int) -> None:
    """Point `latest` at a checkpoint every rank has saved (rank 0, after a barrier)."""
    write_file(checkpoint_root(run_dir) / "latest", f"{steps_done}\n", run_dir)


def read(path: Path, mmap: bool = False) -> dict[str, Any]:
    """A rank file's state, loaded with weights_only=True; a clear error for a file that is
    missing, truncated, not a checkpoint, or that needs a full unpickler (which could run code)."""
    fix = f"Point {path.parents[1] / 'latest'} at an earlier complete step, or start a new run dir."
    if not path.parent.is_dir():
        raise SlimeHydraError(
            f"{path.parents[1] / 'latest'} names step {path.parent.name[5:].lstrip('0')}, but "
            f"{path.parent} does not exist: latest points at no saved checkpoint. " + fix
        )
    if os.path.lexists(path) and not path.is_file():
        what = "a directory" if path.is_dir() else "not a regular file (a FIFO, device or socket)"
        raise SlimeHydraError(
            f"{path} is {what}, not a rank's checkpoint file: the file was replaced after it was "
            "saved. " + fix
        )
    if not path.is_file():
        raise SlimeHydraError(
            f"{path} is missing: the checkpoint was saved by fewer ranks; resume with the same "
            "parallel.* sizes and process count as the run that saved it. " + fix
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise SlimeHydraError(
            f"{path} holds objects that only a full unpickler could rebuild, and unpickling can "
            f"run arbitrary code, so it was not loaded (torch.load: {first[:200]}). slime_hydra "
            "writes tensors and plain containers only: this file was not written by it. " + fix
        ) from None
    except Exception as exc:  # torch raises RuntimeError/EOFError/... for a damaged file
        raise SlimeHydraError(
            f"{path} is not a readable checkpoint (truncated or damaged: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}). " + fix
        ) from None
    keys = ("steps_done", "schedule", "model", "optimizer")
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise SlimeHydraError(
            f"{path} is not a slime_hydra checkpoint (expected a dict with {', '.join(keys)}). "
            + fix
        )
    return state


def _check_identity(path: Path, state: Mapping[str, Any], rank: int, ident: Mapping) -> None:
    """The rank file at `path` was saved by `rank` of this layout and model."""
    fix = "resume with the parallel.* and model config that saved it, or start a new run dir."
    found = state.get("format")
    if found != FORMAT:
        known = isinstance(found, int) and found in OLD_FORMATS
        lacks = OLD_FORMATS[found] if known else "a format this version does not know"
        raise SlimeHydraError(
            f"{path} is a checkpoint of format {found!r}, and this version of slime_hydra reads "
            f"format {FORMAT} only ({lacks}), so a resume cannot check that it fits this run "
            "before launch. Resume it with the slime_hydra version that saved it, or start a new "
            "run dir."
        )
    if state.get("rank") != rank:
        raise SlimeHydraError(
            f"{path} was saved by rank {state.get('rank')!r}, not rank {rank}: the rank files were "
            "swapped or copied between ranks, and training on it would give this rank another "
            "rank's shards. Put each rank's file back under its own name, or start a new run dir."
        )
    for key, group in (("layout", "parallel"), ("dims", "model")):
        if state.get(key) != ident[key]:
            changed = sorted(
                k
                for k in set(state.get(key) or {}) | set(ident[key])
                if (state.get(key) or {}).get(k) != ident[key].get(k)
            )
            names = ", ".join(
                f"{group}.{k}: {(state.get(key) or {}).get(k)!r} saved, {ident[key].get(k)!r} now"
                for k in changed
            )
            raise SlimeHydraError(f"{path} was saved by another {group} config: {names}; " + fix)


def _check_shapes(
    path: Path,
    state: Mapping[str, Any],
    rank: int,
    layout: ParallelLayout,
    dims: ModelDims,
    fused_norms: bool,
    master_copies: bool,
) -> None:
    """Every tensor of the rank file at `path` has the shape it was saved with, every weight the
    shape this run's model gives `rank` (train/step/shapes.py) and no other weight, and the
    optimizer state fits this run's optimizer (`_check_moments`)."""
    fix = "Point latest at an earlier complete step, or start a new run dir."
    recorded = state.get("shapes")
    recorded = recorded if isinstance(recorded, Mapping) else {}
    actual = tensor_shapes({"model": state["model"], "optimizer": state["optimizer"]})
    for name in sorted(set(recorded) | set(actual)):
        saved, found = recorded.get(name), actual.get(name)
        if saved == found:
            continue
        what = "is missing" if found is None else f"has shape {found}"
        was = "was not saved" if saved is None else f"was saved with shape {saved}"
        raise SlimeHydraError(
            f"{path}: {name} {what}, but it {was}: the file was edited after it was saved, "
            "and training on it would fail in the workers or train a changed model. " + fix
        )
    want_shapes = weight_shapes(dims, layout, rank, fused_norms)
    for key, want in want_shapes.items():
        found = actual.get(f"model/{key}")
        if found == list(want):
            continue
        setting = ", ".join(f"{k}={_setting(k, layout, dims)}" for k in fixed_by(key))
        what = "lacks it" if found is None else f"holds shape {found}"
        raise SlimeHydraError(
            f"{path}: this run's model gives rank {rank} the weight {key} with shape "
            f"{list(want)} ({setting}), and the file {what}: it holds another model's weights. "
            "Resume with the model.* and parallel.* config that saved it (the run dir's "
            "config.yaml), or start a new run dir."
        )
    unknown = [
        key
        for key in state["model"]
        if key not in want_shapes
        and not key.endswith("._extra_state")
        and not (fused_norms and ".layer_norm_" in key)
    ]
    if unknown:
        raise SlimeHydraError(
            f"{path}: it holds the weight {unknown[0]}, which this run's model does not have "
            f"({len(unknown)} such keys): it holds another model's weights, or the file was "
            "edited. Resume with the model.* and parallel.* config that saved it (the run dir's "
            "config.yaml), or start a new run dir."
        )
    _check_moments(path, state, want_shapes, master_copies, fused_norms)


def _optimizer_states(obj: Any) -> list[Mapping[str, Any]]:
    """The torch optimizer state_dicts ({"state", "param_groups"}) inside a checkpoint's
    optimizer state: ours, or nested in megatron's wrappers (`optimizer`, a chain's list)."""
    if isinstance(obj, Mapping):
        if isinstance(obj.get("state"), Mapping) and isinstance(obj.get("param_groups"), list):
            return [obj]
        return [s for value in obj.values() for s in _optimizer_states(value)]
    if isinstance(obj, list | tuple):
        return [s for value in obj for s in _optimizer_states(value)]
    return []


TORCH_STATE = "a torch optimizer's state (trainer=cpu, or trainer=gpu with params_dtype=float32)"
MASTER_STATE = (
    "megatron's mixed-precision state with fp32 master copies (trainer=gpu with "
    "trainer.params_dtype=bfloat16 or float16)"
)


def _torch_state(path: Path, saved: Any, master_copies: bool) -> Mapping[str, Any]:
    """The torch optimizer state inside the optimizer state `saved`, which must be the kind this
    run's optimizer loads: with `master_copies` (megatron's for bf16/fp16) `{"optimizer": torch
    state, "fp32_from_fp16_params": [...]}`, else a torch state itself."""
    inner = _optimizer_states(saved)
    if master_copies:
        ok = isinstance(saved, Mapping) and "fp32_from_fp16_params" in saved
        ok = ok and len(inner) == 1 and inner[0] is saved.get("optimizer")
    else:
        ok = len(inner) == 1 and inner[0] is saved
    if ok:
        return inner[0]
    if not inner:
        found = "empty (megatron's distributed optimizer saves none)"
    elif len(inner) > 1:
        found = (
            f"the states of {len(inner)} optimizers (megatron's chain, as for MoE experts, which "
            "this project's model does not have)"
        )
    else:
        found = TORCH_STATE if inner[0] is saved else MASTER_STATE
    raise SlimeHydraError(
        f"{path}: its optimizer state is {found}, and this run's optimizer loads "
        f"{MASTER_STATE if master_copies else TORCH_STATE}: the file was saved by a run with "
        "another trainer config, or edited. Resume with the trainer.* config that saved it (the "
        "run dir's config.yaml), or start a new run dir."
    )


def _check_moments(
    path: Path,
    state: Mapping[str, Any],
    want: Mapping[str, tuple[int, ...]],
    master_copies: bool,
    fused_norms: bool,
) -> None:
    """The optimizer state of the rank file at `path` fits this run's parameters (`want`, their
    shapes in the model's order) as the worker's optimizer loads it: torch's `load_state_dict`
    pairs param groups by position (megatron's and ours: decayed weights, then biases and 1-D
    params) and each group's saved ids with the group's parameters in the model's order, not the
    file's key order; every moment (Adam's exp_avg, exp_avg_sq) and, with `master_copies`, every
    fp32 master copy megatron copies back (`fp32_from_fp16_params`) has its parameter's shape.
    With `fused_norms` (Transformer Engine's layers, GPU only) the pairing is not checked:
    shapes.py does not name the norms fused into the linear layers, so their place is unknown."""
    fix = "Point latest at an earlier complete step, or start a new run dir."
    saved = _torch_state(path, state["optimizer"], master_copies)
    if fused_norms:
        return
    groups = [
        [k for k in want if (k.endswith(".bias") or len(want[k]) == 1) == no_decay]
        for no_decay in (False, True)
    ]
    groups = [g for g in groups if g]
    sizes = [
        len(g["params"]) if isinstance(g, Mapping) and isinstance(g.get("params"), list) else None
        for g in saved["param_groups"]
    ]
    if sizes != [len(g) for g in groups]:
        raise SlimeHydraError(
            f"{path}: its optimizer state holds param groups of {sizes} parameters, and this "
            f"run's model gives rank {state.get('rank')} groups of {[len(g) for g in groups]} "
            "(weights with weight decay, then biases and norms): it is another model's "
            "optimizer, or the file was damaged. " + fix
        )
    names = dict(
        zip(
            (i for g in saved["param_groups"] for i in g["params"]),
            (k for g in groups for k in g),
            strict=True,
        )
    )
    for i in saved["state"]:
        if isinstance(i, int) and i not in names:
            raise SlimeHydraError(
                f"{path}: its optimizer state holds parameter {i}, which none of its param "
                "groups lists: the file was damaged or edited. " + fix
            )
    tensors = [
        (f"{name} of parameter {i}", value, names.get(i))
        for i, moments in saved["state"].items()
        if isinstance(i, int)  # not megatron's "common_step"
        for name, value in (moments if isinstance(moments, Mapping) else {}).items()
        if isinstance(value, torch.Tensor) and value.dim()  # not Adam's step count
    ]
    if master_copies:
        copies = state["optimizer"]["fp32_from_fp16_params"]
        counts = [len(g) if isinstance(g, list | tuple) else None for g in copies]
        if not isinstance(copies, list | tuple) or counts != [len(g) for g in groups]:
            raise SlimeHydraError(
                f"{path}: its fp32 master copies (fp32_from_fp16_params) come in groups of "
                f"{counts if isinstance(copies, list | tuple) else type(copies).__name__} "
                f"parameters, and its param groups hold {[len(g) for g in groups]}: the file "
                "was damaged or edited. " + fix
            )
        tensors += [
            (f"fp32 master copy {j} of param group {g}", value, name)
            for g, (group, group_names) in enumerate(zip(copies, groups, strict=True))
            for j, (value, name) in enumerate(zip(group, group_names, strict=True))
        ]
    for what, value, key in tensors:
        shape = list(value.shape) if isinstance(value, torch.Tensor) else None
        if shape != list(want[key]):
            raise SlimeHydraError(
                f"{path}: the optimizer's {what} ({key}) has shape {shape}, and this run's model "
                f"gives that weight {list(want[key])}: torch pairs saved moments with this run's "
                "parameters by position in the model's order, so training would fail in the "
                "workers or update the weight with another's state. " + fix
            )


def _check_rng(path: Path, state: Mapping[str, Any]) -> None:
    """The RNG states a resume restores are ones torch and Python accept."""
    try:
        torch.Generator().set_state(state.get("torch_rng"))
        random.Random().setstate(state.get("python_rng"))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise SlimeHydraError(
            f"{path} holds an RNG state that cannot be restored ({exc}): the file was damaged "
            "or edited. Point latest at an earlier complete step, or start a new run dir."
        ) from None


def _setting(key: str, layout: ParallelLayout, dims: ModelDims) -> Any:
    """The value of a `model.*` or `parallel.*` key in this run."""
    group, name = key.split(".")
    return getattr(dims if group == "model" else layout, name)


def verify(
    run_dir: Path,
    digest: str,
    layout: ParallelLayout,
    dims: ModelDims,
    fused_norms: bool = False,
    master_copies: bool = False,
) -> int | None:
    """Check, before any worker starts, that the latest checkpoint is whole and matches: `latest`
    is a step count, every rank's file loads (weights only, memory-mapped), was saved by that
    rank of this layout and model after that many steps of this schedule, and holds the tensor
    shapes it recorded and this run's model gives the rank (`fused_norms`: Transformer Engine's
    layers), and an optimizer state this run's optimizer loads (`master_copies`: megatron's for
    bf16/fp16, with fp32 master copies). Returns the steps done (None: no checkpoint)."""
    steps_done = latest_step(run_dir)
    if steps_done is None:
        return None
    ident = identity(layout, dims)
    for rank in range(layout.world_size):
        path = rank_file(run_dir, steps_done, rank)
        state = read(path, mmap=True)
        if state["steps_done"] != steps_done:
            raise SlimeHydraError(
                f"{path} was saved after {state['steps_done']!r} steps, but its dir and "
                f"{checkpoint_root(run_dir) / 'latest'} say {steps_done}; the checkpoint is "
                "inconsistent: point latest at an earlier complete step, or start a new run dir."
            )
        if state["schedule"] != digest:
            raise SlimeHydraError(
                f"the checkpoint in {path.parent} was trained on a different schedule; resume "
                "with the same data, batching and parallel config (the run dir's config.yaml)."
            )
        _check_identity(path, state, rank, ident)
        _check_shapes(path, state, rank, layout, dims, fused_norms, master_copies)
        _check_rng(path, state)
        del state
    return steps_done


def load_weights(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """`model.load_state_dict(weights)`; a ModuleList of megatron DDP chunks loads chunk by chunk
    (its state_dict keys are `i.<name>`: megatron's DDP leaves out its `module.` prefix)."""
    if not isinstance(model, torch.nn.ModuleList):
        model.load_state_dict(weights)
        return
    for i, chunk in enumerate(model):
        prefix = f"{i}."
        chunk.load_state_dict(
            {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
        )


def load(
    run_dir: Path,
    rank: int,
    model: torch.nn.Module,
    optimizer: Any,
    digest: str,
    ident: Mapping[str, Any],
) -> tuple[int, dict[str, int]]:
    """Restore this rank from the latest checkpoint; return the steps done (the next step) and
    the loop's counters. The optimizer keeps the hyperparameters it was built with from the
    current config (lr, weight decay), so a resume with a changed trainer.lr applies it."""
    steps_done = latest_step(run_dir)
    if steps_done is None:
        raise SlimeHydraError(f"{checkpoint_root(run_dir)} holds no checkpoint to resume from.")
    path = rank_file(run_dir, steps_done, rank)
    state = read(path)
    if state["schedule"] != digest:
        raise SlimeHydraError(
            f"the checkpoint in {path.parent} was trained on a different schedule; resume with "
            "the same data, batching and parallel config (the run dir's config.yaml)."
        )
    _check_identity(path, state, rank, ident)
    try:
        load_weights(model, state["model"])
    except RuntimeError as exc:
        raise SlimeHydraError(
            f"{path} does not fit this rank's model: {str(exc).strip().splitlines()[-1][:300]}. "
            "Resume with the model and parallel config that saved it."
        ) from None
    configured = [
        {k: group[k] for k in HYPERPARAMETERS if k in group} for group in optimizer.param_groups
    ]
    optimizer_state = state["optimizer"]
    if state.get("dropped"):
        fresh = optimizer.state_dict()
        for where in state["dropped"]:
            _put(optimizer_state, tuple(where), _get(fresh, tuple(where)))
    try:
        optimizer.load_state_dict(optimizer_state)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise SlimeHydraError(
            f"{path} does not fit this rank's optimizer: {str(exc).strip()[:300]}. Resume with "
            "the model and parallel config that saved it, or start a new run dir."
        ) from None
    for group, values in zip(optimizer.param_groups, configured, strict=False):
        group.update(values)
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return steps_done, dict(state.get("counters") or {})
