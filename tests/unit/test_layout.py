"""The package's shape: modules in layers (none imports, even only for type
checking, one that imports it back), none over 450 lines, no function over 40."""

from __future__ import annotations

import ast
from pathlib import Path

import asyncredlock

PACKAGE = Path(asyncredlock.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The package's modules that ``path`` imports, ``TYPE_CHECKING`` blocks included."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target.startswith("asyncredlock"):
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("asyncredlock"))
    return found


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {target for target in imports(path) if target in paths and target != name}
        for name, path in paths.items()
    }


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in sorted(edges[name]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(edges):
        if name not in state and (found := visit(name)) is not None:
            return found
    return None


def test_the_graph_is_read() -> None:
    edges = graph()
    assert "asyncredlock._core" in edges["asyncredlock._lease"]
    assert "asyncredlock._lock" in edges["asyncredlock._rwlock"]


def test_a_cycle_is_found() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycle(graph()) is None


def lines_of(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines, its signature included and its docstring left out."""
    total = (function.end_lineno or function.lineno) - function.lineno + 1
    if ast.get_docstring(function, clean=False) is not None:
        first = function.body[0]
        total -= (first.end_lineno or first.lineno) - first.lineno + 1
    return total


def test_no_module_over_450_lines() -> None:
    sizes = {module_name(p): len(p.read_text("utf-8").splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {name: size for name, size in sizes.items() if size > 450} == {}


def test_no_function_over_40_lines() -> None:
    long = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (size := lines_of(node)) > 40:
                long[f"{module_name(path)}.{node.name}"] = size
    assert long == {}


def test_a_function_is_measured_without_its_docstring() -> None:
    source = 'def f():\n    """Doc\n    string."""\n    x = 1\n    return x\n'
    (function,) = ast.parse(source).body
    assert isinstance(function, ast.FunctionDef)
    assert lines_of(function) == 3
