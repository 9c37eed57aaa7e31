"""Name -> loader registry for every data set isoprobe can window.

A loader returns a :class:`SeriesCollection`. Offline loaders (data shipped inside packages),
KernelSynth and the online benchmark loaders all register here, so that ``data.dataset=<name>``
means the same thing everywhere and an unknown name fails with the list of known ones.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from isoprobe.errors import IsoprobeError


@dataclass(frozen=True)
class SeriesCollection:
    """Univariate series of one data set, each a 1-D float64 array in time order."""

    name: str
    series: list[np.ndarray]
    freq: str
    season_length: int
    source: str
    license: str
    item_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DatasetSpec:
    """A registered data set: how to load it and its default windowing."""

    name: str
    loader: Callable[..., SeriesCollection]
    context_length: int
    prediction_length: int
    offline: bool
    domain: str
    #: keep what the loader returned for the rest of the process (the jobs of one sweep load
    #: each data set once); false where the source can change under the process (a user's file)
    memo: bool = True


_REGISTRY: dict[str, DatasetSpec] = {}
#: (name, arguments) -> the collection loaded, for data sets registered with ``memo``
_LOADED: dict[tuple[str, tuple[tuple[str, str], ...]], SeriesCollection] = {}


class UnknownDatasetError(IsoprobeError, KeyError):
    """Raised for a data set name that nothing registered."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


def register_dataset(
    name: str,
    *,
    context_length: int,
    prediction_length: int,
    offline: bool,
    domain: str,
    memo: bool = True,
) -> Callable[[Callable[..., SeriesCollection]], Callable[..., SeriesCollection]]:
    """Decorator registering ``loader`` under ``name``."""

    def decorate(loader: Callable[..., SeriesCollection]) -> Callable[..., SeriesCollection]:
        if name in _REGISTRY:
            raise ValueError(f"data set {name!r} is registered twice")
        _REGISTRY[name] = DatasetSpec(
            name, loader, context_length, prediction_length, offline, domain, memo
        )
        return loader

    return decorate


def dataset_spec(name: str) -> DatasetSpec:
    """The registered spec of ``name``; a clear error listing known names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise UnknownDatasetError(
            f"unknown data set {name!r}. Known data sets: {known}. "
            "Pick one with data.dataset=<name> (or data=<domain> for a domain's default)."
        ) from None


def available_datasets(*, offline_only: bool = False) -> list[str]:
    """Sorted names of registered data sets."""
    return sorted(n for n, s in _REGISTRY.items() if s.offline or not offline_only)


def load_series(name: str, **kwargs) -> SeriesCollection:
    """Load the data set registered under ``name``: once per process and arguments where it
    is registered with ``memo`` (a sweep's jobs run in one process; some package data sets
    take seconds to parse), each call getting its own copy to change."""
    spec = dataset_spec(name)
    if not spec.memo:
        return spec.loader(**kwargs)
    key = (name, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
    if key not in _LOADED:
        _LOADED[key] = spec.loader(**kwargs)
    return copy.deepcopy(_LOADED[key])
