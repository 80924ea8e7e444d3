"""No import circles in raycse (the brief's rule), counting imports inside functions too: a lazy
import only hides a circle until the first call that closes it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "raycse"


def module_imports() -> dict[str, set[str]]:
    """raycse module -> the raycse modules it imports (a package's __init__ counts as the package)."""
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {name: set() for name in names}
    for name, path in names.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    if target in names:
                        graph[name].add(target)
                    elif node.module in names:
                        graph[name].add(node.module)
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in names}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_the_checker_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_raycse_has_no_import_circle():
    graph = module_imports()
    assert {"raycse.objectives.registry", "raycse.objectives.hicl", "raycse.train.driver"} <= set(graph)
    assert "raycse.objectives.catalog" in graph["raycse.objectives.hicl"]  # imports are seen
    assert cycles(graph) == []
