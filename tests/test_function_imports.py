"""No module of ``isoprobe/tasks`` or ``isoprobe/spectra`` imports inside a function, where an
import hides a cycle between isoprobe's modules: each imports isoprobe at its top. Only a heavy
third-party dependency that few runs need may be imported where it is used."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import ROOT

PACKAGES = ("isoprobe/tasks", "isoprobe/spectra")
#: third-party packages a function may import, each with why it is not imported at the top
ALLOWED = {
    "wandb": "a run without the W&B logger never starts it",
    "transformers": "only the text and image baselines of task=embedding_spectra read it",
    "sklearn": "only the image baseline of task=embedding_spectra reads its sample images",
}
MODULES = sorted(path for package in PACKAGES for path in (ROOT / package).rglob("*.py"))


def function_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) of each import inside a function of ``source``; a relative import's
    module is written with its dots."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found += [(node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                found.append((node.lineno, "." * node.level + (node.module or "")))
    return sorted(set(found))


def test_the_walk_finds_imports_in_functions_methods_and_nested_functions():
    source = (
        "import os\n"
        "def f():\n"
        "    from isoprobe.tasks import runner\n"
        "class C:\n"
        "    def m(self):\n"
        "        def inner():\n"
        "            import wandb\n"
        "        from . import task\n"
    )
    assert function_imports(source) == [(3, "isoprobe.tasks"), (7, "wandb"), (8, ".")]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_function_imports_only_an_allowed_third_party_package(path):
    refused = [
        f"{path.relative_to(ROOT)}:{line} imports {module} inside a function"
        for line, module in function_imports(path.read_text())
        if module.split(".")[0] not in ALLOWED
    ]
    assert not refused, "; ".join(refused)
