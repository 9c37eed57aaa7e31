"""Name -> loader registry for every data set isoprobe can window.

A loader returns a :class:`SeriesCollection`. Offline loaders (data shipped inside packages),
KernelSynth and the online benchmark loaders all register here, so that ``data.dataset=<name>``
means the same thing everywhere and an unknown name fails with the list of known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


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


_REGISTRY: dict[str, DatasetSpec] = {}


class UnknownDatasetError(KeyError):
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
) -> Callable[[Callable[..., SeriesCollection]], Callable[..., SeriesCollection]]:
    """Decorator registering ``loader`` under ``name``."""

    def decorate(loader: Callable[..., SeriesCollection]) -> Callable[..., SeriesCollection]:
        if name in _REGISTRY:
            raise ValueError(f"data set {name!r} is registered twice")
        _REGISTRY[name] = DatasetSpec(
            name, loader, context_length, prediction_length, offline, domain
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
    """Load the data set registered under ``name``."""
    return dataset_spec(name).loader(**kwargs)
