"""The registry of the isotropy probe's measures: name -> function, with the keys it produces.

A measure is registered where its function is defined, with :func:`register_measure`::

    @register_measure("participation_ratio")
    def _participation_ratio(tokens: Tokens) -> dict[str, float]:
        return {"participation_ratio": participation_ratio_from_eigenvalues(tokens.eigenvalues)}

It is then selectable by name (``callbacks.isotropy.metrics.metrics``), runs under
``metrics: all`` (the default), and its keys are the metric names of the probe's rows, CSV and
logs. The function takes the layer's :class:`isoprobe.metrics.suite.Tokens` (the token matrix,
the intermediates every measure shares, the probe's options and the previous layer's tokens) and
returns exactly the keys it was registered with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from isoprobe.metrics.suite import Tokens

#: the selection that means every registered measure
ALL = "all"


@dataclass(frozen=True)
class Measure:
    """A registered measure: ``fn(tokens) -> {key: value}`` producing exactly ``keys``."""

    name: str
    keys: tuple[str, ...]
    fn: Callable[[Tokens], Mapping[str, Any]]


_MEASURES: dict[str, Measure] = {}
_KEYS: dict[str, tuple[str, ...]] = {}
#: name -> :class:`Measure`, in registration order (read-only view of the registry)
MEASURES: Mapping[str, Measure] = MappingProxyType(_MEASURES)
#: name -> the keys it produces, in registration order (read-only view of the registry)
ALL_METRICS: Mapping[str, tuple[str, ...]] = MappingProxyType(_KEYS)
#: former metric names -> their names now
RENAMED_METRICS: Mapping[str, str] = MappingProxyType({"eps_rank": "eps_rank_centred"})


def register_measure(
    name: str, keys: Sequence[str] | None = None
) -> Callable[[Callable[[Tokens], Mapping[str, Any]]], Callable[[Tokens], Mapping[str, Any]]]:
    """Decorator: register ``fn(tokens) -> {key: value}`` as the measure ``name``, producing
    ``keys`` (default: the one key ``name``). Names and keys are unique across measures (they
    become metric names); ``all`` and former names are reserved."""
    produced = tuple(keys) if keys is not None else (name,)

    def register(
        fn: Callable[[Tokens], Mapping[str, Any]],
    ) -> Callable[[Tokens], Mapping[str, Any]]:
        if name == ALL or name in RENAMED_METRICS or name in _MEASURES:
            raise ValueError(f"probe measure name {name!r} is taken; registered: {list(_KEYS)}")
        taken = {key for existing in _KEYS.values() for key in existing}
        clash = [key for key in produced if key in taken]
        if not produced or clash or len(set(produced)) < len(produced):
            raise ValueError(
                f"probe measure {name!r}: its keys {list(produced)} must be distinct, new and at "
                f"least one (already produced by other measures: {clash})"
            )
        _MEASURES[name] = Measure(name, produced, fn)
        _KEYS[name] = produced
        return fn

    return register


def unregister_measure(name: str) -> None:
    """Remove the measure ``name`` from the registry (a plug-in's, or a test's)."""
    del _MEASURES[name], _KEYS[name]


def selected_measures(metrics: str | Sequence[str]) -> tuple[str, ...]:
    """The measure names ``metrics`` selects: ``"all"`` (every registered measure, in
    registration order), one name or a list of names, each checked against the registry."""
    if isinstance(metrics, str):
        return tuple(_KEYS) if metrics == ALL else selected_measures([metrics])
    names = tuple(metrics)
    if not names:
        raise ValueError(
            f"no probe metric chosen (metrics=[]); choose from {list(_KEYS)} or {ALL!r}, or "
            "turn the probe off with callbacks=none"
        )
    renamed = {m: RENAMED_METRICS[m] for m in names if m in RENAMED_METRICS}
    if renamed:
        raise ValueError(
            f"probe metrics {list(renamed)} were renamed: write {list(renamed.values())} "
            "in callbacks.isotropy.metrics.metrics"
        )
    unknown = [m for m in names if m not in _MEASURES]
    if unknown:
        raise ValueError(
            f"unknown probe metrics {unknown}; choose from {list(_KEYS)} or {ALL!r} (a new "
            "measure is registered with isoprobe.metrics.register_measure)"
        )
    return names
