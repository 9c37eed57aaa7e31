"""The package list, found rather than listed (pyproject.toml holds everything else).

Every isoprobe package is found under ``isoprobe/``; isoprobe's Hydra sweeper lives in
``hydra_plugins/`` (a namespace package shared by every Hydra plugin), where Hydra looks for
plugins.
"""

from setuptools import find_namespace_packages, find_packages, setup


def isoprobe_packages() -> list[str]:
    own = find_packages(include=["isoprobe", "isoprobe.*"])
    plugins = find_namespace_packages(include=["hydra_plugins.*"])
    return [*own, *plugins]


setup(packages=isoprobe_packages())
