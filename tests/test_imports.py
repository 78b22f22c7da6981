"""Imports run one way (STYLE.md section 1): vitkit's module-level import graph has no cycle, its packages
import each other in one direction only, and no vitkit import hides inside a function to dodge a cycle.

The graph is read from the source with `ast` (module-level imports, class bodies included, since they run at
import), never by importing: a cycle that Python happens to tolerate today still fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import vitkit

ROOT = Path(vitkit.__file__).parent

# Importers whose function-level vitkit imports are all deliberate: each verb of the CLI imports its engine
# when it runs, so that `vitkit --help` and the light verbs start without the training engine or matplotlib.
LAZY_IMPORTERS = ("vitkit.cli",)

ROOT_LAZY = "the root's public names import torch when first used: `import vitkit` and the command's start-up need none"

# The other function-level vitkit imports, (importer, imported) -> why it is not at module level.  A new one
# fails test_no_other_function_level_imports, and so does an entry that is no longer needed: the list only shrinks.
LAZY_IMPORTS = {
    ("vitkit.train", "vitkit.train.trainer"): "package attributes `train`, `Trainer`: vitkit.train.config alone "
    "must not import the whole engine",
    ("vitkit.eval.commands", "vitkit.eval.plots"): "matplotlib (~0.6 s) only for the eval verb's confusion figure",
    ("vitkit", "vitkit.checkpoints"): ROOT_LAZY,
    ("vitkit", "vitkit.eval.features"): ROOT_LAZY,
    ("vitkit", "vitkit.eval.predict"): ROOT_LAZY,
    ("vitkit", "vitkit.models"): ROOT_LAZY,
    ("vitkit", "vitkit.runs"): ROOT_LAZY,
    ("vitkit.__main__", "vitkit.cli"): "Ctrl-C while the command's modules load is caught around their import",
    ("vitkit.serve.model", "vitkit.inspect.plots"): "matplotlib only when an attention overlay is drawn",
    # Neither a cycle nor a heavy dependency: to move to module level with their modules' next change.
    ("vitkit.data.shard", "vitkit.data.large"): "no reason",
    ("vitkit.runs", "vitkit.checkpoints"): "no reason",
    ("vitkit.serve.model", "vitkit.device"): "no reason",
    ("vitkit.serve.model", "vitkit.eval.features"): "no reason",
    ("vitkit.serve.model", "vitkit.runs"): "no reason",
    ("vitkit.serve.worker", "vitkit.serve.engine"): "no reason",
    ("vitkit.serve.worker", "vitkit.serve.model"): "no reason",
}


def source_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the vitkit package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("vitkit", *path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = source_modules()


def targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The vitkit modules an import statement names: `from a.b import c` is a.b.c where that is a module."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolved against the importing package
            package = module.split(".")[: None if is_package else -1]
            base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in MODULES:  # `import vitkit.models.vit as v`, attribute imports
            name = name.rpartition(".")[0]
        if name and name != module:
            found.append(name)
    return found


def imports(module: str) -> tuple[set[str], set[str]]:
    """(modules imported at module level, modules imported inside a function) by `module`."""
    path = MODULES[module]
    top: set[str] = set()
    inner: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if in_function else top).update(targets(child, module, path.name == "__init__.py"))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return top, inner


GRAPH = {module: imports(module) for module in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def package(module: str) -> str:
    """vitkit.train.plan -> vitkit.train; top-level modules (vitkit.runs) are their own package."""
    return ".".join(module.split(".")[:2])


def test_find_cycle_reports_a_cycle_and_only_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_scan_sees_module_and_function_level_imports() -> None:
    assert "vitkit.ssl.masked_patch" in GRAPH["vitkit.train.objectives"][0]  # the engine builds on MPP's maths
    assert "vitkit.reproduce.report" in GRAPH["vitkit.reproduce.study"][0]  # the runner calls the presentation
    assert "vitkit.eval.plots" in GRAPH["vitkit.eval.commands"][1]
    assert len(MODULES) > 100 and "vitkit" in MODULES and "vitkit.reproduce" in MODULES


def test_module_level_imports_have_no_cycle() -> None:
    cycle = find_cycle({module: top for module, (top, _) in GRAPH.items()})
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_packages_import_each_other_one_way() -> None:
    edges: dict[str, set[str]] = {}
    for module, (top, _) in GRAPH.items():
        if module != "vitkit":  # the root re-exports the public API from below; nothing imports it
            edges.setdefault(package(module), set()).update(package(t) for t in top if package(t) != package(module))
    cycle = find_cycle(edges)
    assert cycle is None, "packages import each other: " + " -> ".join(cycle or [])


def test_nothing_imports_the_root_package() -> None:
    assert [module for module, (top, _) in GRAPH.items() if "vitkit" in top] == []


def test_no_other_function_level_imports() -> None:
    found = {
        (module, target)
        for module, (_, inner) in GRAPH.items()
        for target in inner
        if not module.startswith(LAZY_IMPORTERS)
    }
    assert sorted(found - set(LAZY_IMPORTS)) == [], "import at module level (or list it, with its reason)"
    assert sorted(set(LAZY_IMPORTS) - found) == [], "no longer imported in a function: remove from LAZY_IMPORTS"


# torch APIs vitkit uses at import, each with the first release that has it: the declared floor covers them all
TORCH_APIS = {("torch.optim", "Muon"): (2, 9)}  # train/muon.py subclasses it


def test_the_declared_torch_floor_has_every_api_vitkit_imports() -> None:
    """pyproject said torch>=2.4, and `vitkit train` died at import on 2.4.1 (torch.optim.Muon came in 2.9)."""
    import importlib
    import re

    import torch

    text = (ROOT.parents[1] / "pyproject.toml").read_text()
    floor = tuple(int(part) for part in re.search(r'"torch>=(\d+)\.(\d+)', text).groups())
    assert floor >= max(TORCH_APIS.values())
    for (module, name), release in TORCH_APIS.items():  # the table holds what this torch has
        assert hasattr(importlib.import_module(module), name) and torch.__version__ >= f"{release[0]}.{release[1]}"
