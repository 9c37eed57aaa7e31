"""The callbacks form no import cycle, counting imports under TYPE_CHECKING (read from the
source, so a cycle the ``callbacks`` -> ``isoprobe.callbacks`` mapping would hide counts too)."""

from __future__ import annotations

import ast
from pathlib import Path

CALLBACKS = Path(__file__).resolve().parents[2] / "callbacks"
MODULES = sorted(p.stem for p in CALLBACKS.glob("*.py") if p.stem != "__init__")


def _imported_callbacks(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            for prefix in ("isoprobe.callbacks.", "callbacks."):
                if name.startswith(prefix):
                    found.add(name[len(prefix) :].split(".")[0])
    return found


def test_the_callbacks_import_graph_has_no_cycle():
    graph = {m: _imported_callbacks(CALLBACKS / f"{m}.py") for m in MODULES}
    assert set().union(*graph.values()) <= set(MODULES)
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import cycle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in graph[module]:
                visit(imported, (*path, module))
            done.add(module)

    for module in MODULES:
        visit(module, ())
    # the hub imports no measure set: data flows from it to them
    assert not graph["hub"] & {"probe", "isotropy", "rank", "similarity", "readout"}
