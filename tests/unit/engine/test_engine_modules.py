"""The engine package's rooms: no import circle among its modules, and the snapshot composes the
parts' own state without reaching into a private attribute of any of them."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[3] / "pipeline" / "engine"


def _imports(path: Path) -> set[str]:
    """The ``pipeline.engine`` modules ``path`` imports, type-only imports included."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline.engine."):
            out.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.ImportFrom) and node.module == "pipeline.engine":
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.rsplit(".", 1)[1] for a in node.names if a.name.startswith("pipeline.engine.")}
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_engine_modules_import_no_circle() -> None:
    graph = {p.stem: _imports(p) for p in ENGINE.glob("*.py") if p.stem != "__init__"}
    assert _cycle(graph) is None, _cycle(graph)
    assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]  # the check itself can fail


def test_the_snapshot_reads_no_private_attribute_and_does_not_import_the_engine() -> None:
    tree = ast.parse((ENGINE / "snapshot.py").read_text(encoding="utf-8"))
    private = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
               and n.attr.startswith("_") and not n.attr.startswith("__")]
    assert private == []
    assert "engine" not in _imports(ENGINE / "snapshot.py")
