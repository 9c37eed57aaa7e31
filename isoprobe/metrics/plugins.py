"""Measures from the user's own modules: importing a module registers the measures in it
(:func:`isoprobe.metrics.register_measure`, :func:`isoprobe.metrics.describe_metric`), so a
setting that lists modules (``callbacks.probe.plugins``, ``analyze.plugins``) is all it
takes to add one, without editing isoprobe."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from isoprobe.errors import IsoprobeError


def import_plugins(modules: Sequence[str], setting: str) -> None:
    """Import each module of ``modules`` (dotted names, as ``import`` takes them); one that
    cannot be imported is refused naming ``setting`` and the fix."""
    if isinstance(modules, str):
        modules = [modules]
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise IsoprobeError(
                f"{setting}: cannot import the measure plug-in module {name!r} ({err}). Give "
                "its dotted name as you would import it, with its directory on PYTHONPATH (or "
                "the directory you run from)."
            ) from err
