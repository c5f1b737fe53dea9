"""The package's shape: modules read from the top down, the maths stays free of transformers,
functions stay short."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hf_sliced_attn"
MAX_FUNCTION_LINES = 80


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The package modules that ``path`` imports (relative imports resolved; ``from x import y``
    counts x.y when that is a module of the package)."""
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
        found.update(c for c in candidates if c.startswith("hf_sliced_attn"))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}


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
    graph = _graph()
    assert "hf_sliced_attn.convert" in graph["hf_sliced_attn.cli"]
    assert "hf_sliced_attn.mechanisms.base" in graph["hf_sliced_attn.mechanisms.sliced_relu.config"]


def test_ops_do_not_import_transformers():
    for path in (PACKAGE / "ops").rglob("*.py"):
        text = path.read_text()
        assert "import transformers" not in text and "from transformers" not in text, path


@pytest.mark.parametrize("folder", ["hf_sliced_attn", "recipes"])
def test_no_function_is_over_80_lines(folder):
    long = []
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, long
