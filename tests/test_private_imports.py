"""No module of isoprobe imports another package's private name (a name starting with ``_``):
what one package needs of another is public there. Read from the source, imports under
``TYPE_CHECKING`` included."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "isoprobe"


def _package_of(module: str) -> str:
    """``isoprobe.probing.collect`` -> ``isoprobe.probing``; a package is its own."""
    path = PACKAGE.parent / Path(*module.split("."))
    return module if path.is_dir() else module.rsplit(".", 1)[0]


def _private_imports(path: Path) -> list[str]:
    own = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        if not node.module.startswith("isoprobe") or _package_of(node.module) == _package_of(own):
            continue
        found += [
            f"{own} imports {node.module}.{alias.name}"
            for alias in node.names
            if alias.name.startswith("_") and not alias.name.startswith("__")
        ]
    return found


def test_no_package_imports_a_private_name_of_another():
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in _private_imports(path)]
    assert found == []
