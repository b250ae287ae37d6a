"""Imports run one way (DESIGN.md's layout): a package imports only the layers below it, no
import cycle anywhere in the package, and the pure layers import no torch, Hydra or OmegaConf.
train/ is layered inside too: its plain data (settings, job) below what computes a step (step/),
below what runs processes (run/). Read from the sources with `ast`, so a lazy import inside a
function, or one for type hints only, counts as much as one at the top."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "slime_hydra"

LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "errors",
        "files",  # writing run-dir files and reading user files safely
        "partition",
        "schedule",  # + the pure cost model
        "planner",  # the planning API over schedule's strategies and metrics
        "compat",  # slime's and verl's partition calls on the planner
        "hf instantiate rundir calibration",  # HF config.json, tokenizers; objects; cost files
        "data log",
        "train train.job",  # the Job the app plans (plain data)
        # The trainers' settings (plain data); report's figures and the W&B workspace beside
        # them, so that neither they nor what computes or runs a step import each other.
        "train.settings report dashboard",
        "train.step",  # computes a step: model, attention, loss, optimizer, engine, shims
        "train.run",  # runs processes: checks, launcher, worker, loop, checkpoints, plan mode
        "config",
        "app sweep",
        "__main__",
        "calibrate",  # python -m slime_hydra.calibrate: the config composed as __main__ does
    )
)
"""Bottom to top; a module may import from its own unit and from lower layers only."""

LAYERED = ("train",)
"""Packages whose subpackages and modules are units of their own (train.step, train.run, ...)."""

PURE = ("partition", "schedule", "planner", "compat")
HEAVY = ("torch", "hydra", "omegaconf", "megatron")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The package under slime_hydra (or the top-level module) a module belongs to; within a
    LAYERED package, its subpackage or module (slime_hydra.train.run.loop → train.run)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in LAYERED:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else parts[0]


def layer(module: str) -> int:
    (index,) = [i for i, names in enumerate(LAYERS) if unit(module) in names]
    return index


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str) -> Iterator[tuple[str, bool]]:
    """(imported module, at import time?) for every import in the module's source; an import
    inside a function or under TYPE_CHECKING does not run when the module is imported."""
    tree = ast.parse(MODULES[module].read_text())
    deferred: set[int] = set()
    for node in ast.walk(tree):
        typing_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if typing_only or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            deferred.update(id(n) for n in ast.walk(node) if n is not node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [node.module, *(m for m in submodules if m in MODULES)]
        else:
            continue
        for name in names:
            yield name, id(node) not in deferred


def test_the_layer_table_covers_every_package() -> None:
    assert {unit(m) for m in MODULES if m != "slime_hydra"} <= set().union(*LAYERS)


def upward(module: str) -> list[str]:
    """The slime_hydra modules `module` imports from its own layer or above."""
    return sorted(
        name
        for name, _ in imports(module)
        if name.startswith("slime_hydra.")
        and unit(name) != unit(module)
        and layer(name) >= layer(module)
    )


def heavy(module: str) -> list[str]:
    """The torch, Hydra, OmegaConf or megatron modules `module` imports."""
    return sorted(name for name, _ in imports(module) if name.split(".")[0] in HEAVY)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module: str) -> None:
    assert not upward(module), f"{module} (layer {unit(module)}) imports {upward(module)}"


def test_a_planted_upward_or_heavy_import_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks above fail on a bad import: compat reaching up into log, and into torch."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from slime_hydra.schedule import Schedule\n"
        "from slime_hydra.log.sink import RunInfo\n"
        "def later():\n    import torch\n"
    )
    monkeypatch.setitem(MODULES, "slime_hydra.compat.planted", planted)
    assert upward("slime_hydra.compat.planted") == ["slime_hydra.log.sink"]
    assert heavy("slime_hydra.compat.planted") == ["torch"]


def test_a_planted_upward_import_inside_train_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """train/'s own layers hold too: step/ reaching up into run/, settings into either."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from slime_hydra.train.step.model import build_model_chunks\n"
        "def later():\n    from slime_hydra.train.run.worker import train\n"
    )
    monkeypatch.setitem(MODULES, "slime_hydra.train.step.planted", planted)
    monkeypatch.setitem(MODULES, "slime_hydra.train.settings", planted)
    assert upward("slime_hydra.train.step.planted") == ["slime_hydra.train.run.worker"]
    assert upward("slime_hydra.train.settings") == [
        "slime_hydra.train.run.worker",
        "slime_hydra.train.step.model",
    ]


def import_cycle() -> list[str] | None:
    """The first import cycle among the package's modules (depth-first search), as the modules
    around it, or None. Every import counts: at the top, inside a function, or for type hints
    only, since each one is a way back up that a reader follows."""
    graph = {m: {n for n, _ in imports(m) if n in MODULES and n != m} for m in MODULES}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            found = visit(target, [*path, module])
            if found:
                return found
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module, [])
        if found:
            return found
    return None


def test_no_import_cycle_anywhere() -> None:
    found = import_cycle()
    assert found is None, "import cycle: " + " → ".join(found or [])


def test_a_planted_cycle_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two modules that reach each other, one lazily and one for type hints only, are a cycle."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("def later():\n    from slime_hydra.train.run.second import x\n")
    second.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from slime_hydra.train.run.first import later\n"
    )
    monkeypatch.setitem(MODULES, "slime_hydra.train.run.first", first)
    monkeypatch.setitem(MODULES, "slime_hydra.train.run.second", second)
    assert import_cycle() == [
        "slime_hydra.train.run.first",
        "slime_hydra.train.run.second",
        "slime_hydra.train.run.first",
    ]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if unit(m) in PURE))
def test_pure_layers_import_no_torch_hydra_or_omegaconf(module: str) -> None:
    assert not heavy(module), f"{module} is pure logic but imports {heavy(module)}"
