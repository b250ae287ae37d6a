"""Imports run one way (DESIGN.md's layout): a package imports only the layers below it, no two
modules import each other, and the pure layers import no torch, Hydra or OmegaConf. Read from
the sources with `ast`, so a lazy import inside a function counts as much as one at the top."""

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
        "hf instantiate rundir",  # HF config.json and tokenizer reading; object building
        "data log",
        "train report dashboard",
        "config",
        "app sweep",
        "__main__",
    )
)
"""Bottom to top; a module may import from its own package and from lower layers only."""

PURE = ("partition", "schedule", "planner", "compat")
HEAVY = ("torch", "hydra", "omegaconf", "megatron")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The package under slime_hydra (or the top-level module) a module belongs to."""
    parts = module.split(".")
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


def test_no_module_imports_itself_back() -> None:
    """No cycle among the imports that run at import time (depth-first search)."""
    graph = {
        m: {n for n, eager in imports(m) if eager and n in MODULES and n != m} for m in MODULES
    }
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            pytest.fail("import cycle: " + " → ".join([*path[path.index(module) :], module]))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


@pytest.mark.parametrize("module", sorted(m for m in MODULES if unit(m) in PURE))
def test_pure_layers_import_no_torch_hydra_or_omegaconf(module: str) -> None:
    assert not heavy(module), f"{module} is pure logic but imports {heavy(module)}"
