"""The package list, found rather than listed (pyproject.toml holds everything else).

``isoprobe.callbacks`` lives in ``callbacks/`` at the repository root (pyproject.toml's
``package-dir`` maps it), where discovery under ``isoprobe/`` cannot see it, so its packages are
found there and renamed; every other package is found under ``isoprobe/``. isoprobe's Hydra
sweeper lives in ``hydra_plugins/`` (a namespace package shared by every Hydra plugin), where
Hydra looks for plugins.
"""

from setuptools import find_namespace_packages, find_packages, setup


def isoprobe_packages() -> list[str]:
    own = find_packages(include=["isoprobe", "isoprobe.*"], exclude=["isoprobe.callbacks*"])
    callbacks = find_packages(include=["callbacks", "callbacks.*"])
    plugins = find_namespace_packages(include=["hydra_plugins.*"])
    return [*own, *(f"isoprobe.{name}" for name in callbacks), *plugins]


setup(packages=isoprobe_packages())
