"""The code's shape: no import cycles, the maths stays free of transformers, functions stay short."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_sliced_attn"
FOLDERS = ("hf_sliced_attn", "recipes", "benchmarks")
"""The code the checks below cover: the package, the recipe scripts and the benchmarks."""
MAX_FUNCTION_LINES = 80


def _import_root(path: Path) -> Path:
    """The folder a module's dotted name counts from: the repository for the package and the benchmarks
    (``benchmarks._harness``), the recipes' own folder for the recipes (a script imports its neighbours by
    name, ``from glue_data import ...``)."""
    return ROOT / "recipes" if (ROOT / "recipes") in path.parents else ROOT


def _module_name(path: Path) -> str:
    parts = path.relative_to(_import_root(path)).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ``modules`` that ``path`` imports (relative imports resolved; ``from x import y`` counts x.y when
    that is one of them)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c in modules)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _is_ancestor(package: str, module: str) -> bool:
    return module.startswith(package + ".")


def test_no_module_imports_one_that_imports_it_back():
    """No cycle in the import graph, a package's own __init__ importing its submodules aside."""
    graph = {name: {m for m in deps if not _is_ancestor(name, m) and not _is_ancestor(m, name)}
             for name, deps in _graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_check_can_fail():
    """The graph sees imports in all three folders: absolute, relative, and a recipe's of its neighbour."""
    graph = _graph()
    assert "hf_sliced_attn.convert" in graph["hf_sliced_attn.cli"]
    assert "hf_sliced_attn.mechanisms.local_window" in graph["hf_sliced_attn.mechanisms.sliced_relu.config"]
    assert "glue_data" in graph["glue"] and "hf_sliced_attn.conversion.pipeline" in graph["glue"]
    assert "benchmarks._harness" in graph["benchmarks.bench_quality"]


def test_ops_do_not_import_transformers():
    for path in (PACKAGE / "ops").rglob("*.py"):
        text = path.read_text()
        assert "import transformers" not in text and "from transformers" not in text, path


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_function_is_over_80_lines(folder):
    long = []
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long
