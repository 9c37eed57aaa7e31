"""A griffe extension for the API pages: the docstrings cross-reference with Sphinx roles
(``:class:`~isoprobe.tasks.task.Task```, ``:meth:`loss```), which Markdown does not read. Each
role becomes a code span of its target (``Task``, or the whole dotted path without ``~``), so
the pages show names, not markup. mkdocs.yml loads it for mkdocstrings' Python handler."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?[a-z]+:`(~?)([^`]+)`")


def as_code(match: re.Match[str]) -> str:
    """``:role:`~a.b.C``` -> `` `C` ``, ``:role:`a.b.C``` -> `` `a.b.C` ``."""
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRolesToCode(griffe.Extension):
    """Rewrites every object's docstring as it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(as_code, obj.docstring.value)
