"""The packages form layers: no two of them import each other, directly or around a loop.

Imports anywhere in a module count, module level or inside a function (a lazy import is still
a dependency). The registry's "module:function" strings are data, loaded on use, and do not.
"""

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import specsim

ROOT = Path(specsim.__file__).parent


def _unit(path: Path) -> str:
    """A package below specsim (its folder), or a top-level module (its name)."""
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "specsim" or len(parts) < 2:
        return None
    return parts[1]


def import_graph() -> dict[str, dict[str, set[str]]]:
    """{unit: {imported unit: {files importing it}}}."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in ROOT.rglob("*.py"):
        here = _unit(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = ([f"specsim.{a.name}" for a in node.names] if node.module == "specsim" else [node.module])
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                there = _target(module)
                if there and there != here and (ROOT / there).exists() | (ROOT / f"{there}.py").exists():
                    graph[here][there].add(str(path.relative_to(ROOT.parent)))
    return graph


def _cycle(graph) -> list[str] | None:
    """One import loop between units, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(u: str) -> list[str] | None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, {})):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state and (found := visit(v)):
                return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state and (found := visit(u)):
            return found
    return None


def test_no_package_imports_another_around_a_loop():
    graph = import_graph()
    loop = _cycle(graph)
    if loop:
        where = "; ".join(f"{a} -> {b} in {', '.join(sorted(graph[a][b]))}" for a, b in zip(loop, loop[1:]))
        raise AssertionError(f"import loop {' -> '.join(loop)}: {where}")


def test_the_check_finds_a_loop():
    """It can fail: a graph with one back edge is reported."""
    assert _cycle({"a": {"b": {"x"}}, "b": {"c": {"y"}}, "c": {"a": {"z"}}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": {"x"}}, "b": {}}) is None


def test_the_numpy_side_does_not_import_the_torch_side():
    """cache, trees, verify, sim and specs replay on numpy: they import neither record, live nor attention."""
    graph = import_graph()
    for low in ("cache", "trees", "verify", "sim", "specs", "expansion"):
        assert not set(graph.get(low, {})) & {"record", "live", "attention"}, (low, dict(graph.get(low, {})))


def test_recording_and_training_import_no_polars():
    """`cache` and `train-draft` run where polars is not installed (a GPU image): only the tables import it."""
    code = ("import specsim.cli.cache_cmd, specsim.cli.train_cmd, specsim.record.run, specsim.record.train, "
            "specsim.cache.provenance, sys; assert 'polars' not in sys.modules, 'polars imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
