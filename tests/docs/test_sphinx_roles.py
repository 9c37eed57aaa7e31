"""The API pages' griffe extension (docs/_ext/sphinx_roles.py): Sphinx roles become code spans."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("griffe")

EXTENSION = Path(__file__).resolve().parents[2] / "docs" / "_ext" / "sphinx_roles.py"


def load_extension():
    spec = importlib.util.spec_from_file_location("sphinx_roles", EXTENSION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("docstring", "shown"),
    [
        (":class:`~isoprobe.tasks.task.Task`", "`Task`"),
        (":func:`isoprobe.tasks.run_task`", "`isoprobe.tasks.run_task`"),
        (":meth:`loss` and :data:`TASKS`", "`loss` and `TASKS`"),
        (":py:mod:`isoprobe.models.adaptation`", "`isoprobe.models.adaptation`"),
        ("``context`` [B, C], no role", "``context`` [B, C], no role"),
    ],
)
def test_a_role_becomes_a_code_span_of_its_target(docstring, shown):
    roles = load_extension()
    assert roles.ROLE.sub(roles.as_code, docstring) == shown


def test_the_extension_rewrites_a_loaded_docstring():
    import griffe

    roles = load_extension()
    module = griffe.temporary_visited_module(
        '"""Run by :func:`~isoprobe.tasks.run_task`."""',
        extensions=griffe.load_extensions(roles.SphinxRolesToCode()),
    )
    with module as loaded:
        assert loaded.docstring.value == "Run by `run_task`."
