"""The layout of isoprobe/models: a family of several files is a subpackage, and no module is a
re-export of another (read from the source, so nothing is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "isoprobe" / "models"
MODULES = sorted(p for p in MODELS.rglob("*.py") if "bundled" not in p.relative_to(MODELS).parts)
SUBPACKAGES = sorted(p.parent.name for p in MODELS.glob("*/__init__.py"))


def _body(path: Path) -> list[ast.stmt]:
    """The module's statements after its docstring and ``from __future__`` imports."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [s for s in body if not (isinstance(s, ast.ImportFrom) and s.module == "__future__")]


def _bound_here(body: list[ast.stmt]) -> set[str]:
    """The names the module's own top-level statements define (not those it imports)."""
    names = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _exported(body: list[ast.stmt]) -> list[str]:
    """The strings of the module's ``__all__``, if it has one."""
    for node in body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return []


def test_the_layout_is_read_from_the_tree():
    assert len(MODULES) > 30
    assert {
        "chronos",
        "lag_llama",
        "llm",
        "moirai",
        "moirai2",
        "time_moe",
        "timesfm25",
        "tirex",
        "sundial",
        "toto",
        "totem",
        "visionts",
    } <= set(SUBPACKAGES)


def test_every_package_init_is_a_docstring_only():
    for path in [MODELS / "__init__.py", *(MODELS / name / "__init__.py" for name in SUBPACKAGES)]:
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.relative_to(MODELS)} has no docstring"
        assert not _body(path), f"{path.relative_to(MODELS)} holds more than its docstring"


def test_no_module_is_a_body_of_imports():
    for path in MODULES:
        if path.name == "__init__.py":
            continue
        body = _body(path)
        own = [s for s in body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        assert own, f"{path.relative_to(MODELS)} only imports: a re-export of another module"


def test_a_module_exports_only_what_it_defines():
    for path in MODULES:
        body = _body(path)
        foreign = sorted(set(_exported(body)) - _bound_here(body))
        assert not foreign, f"{path.relative_to(MODELS)} re-exports {foreign}; import them at home"


def test_no_module_beside_a_family_subpackage_carries_its_name():
    for path in MODELS.glob("*.py"):
        family = [name for name in SUBPACKAGES if path.stem.startswith(name)]
        assert not family, f"{path.name} sits beside the {family[0]}/ subpackage: move it in"
