"""The registry of the isotropy probe's measures: name -> function, with the keys it produces,
and of every metric key's metadata (:class:`MetricInfo`), which the run's summary table, the
probe's plots and ``task=analyze`` read: no metric name is written anywhere else.

A measure is registered where its function is defined, with :func:`register_measure`::

    @register_measure("participation_ratio")
    def _participation_ratio(tokens: Tokens) -> dict[str, float]:
        return {"participation_ratio": participation_ratio_from_eigenvalues(tokens.eigenvalues)}

It is then selectable by name (``callbacks.probe.isotropy.metrics.metrics``), runs under
``metrics: all`` (the default), and its keys are the metric names of the probe's rows, CSV and
logs. The function takes the layer's :class:`isoprobe.metrics.suite.Tokens` (the token matrix,
the intermediates every measure shares, the probe's options and the previous layer's tokens) and
returns exactly the keys it was registered with.
"""

from __future__ import annotations

import re
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


@dataclass(frozen=True)
class MetricInfo:
    """What the summary, the plots and the analysis know of a metric key.

    Attributes:
        direction: +1 where a larger value is the more isotropic (or, for a forecast measure,
            the better) one, -1 where a smaller value is, 0 where neither (a count, a choice).
        summary: a column of the table a run ends with (:mod:`isoprobe.tasks.summary`).
        log_scale: plotted on a log scale (its values span decades).
        shown: in ``task=analyze``'s scatter and trajectory figures.
        bookkeeping: describes the probe, not the representation (``n_tokens``): left out of
            the analysis's associations.
        forecast: measures a forecast read from the representation (the readout), not its
            geometry: the analysis sets it against the geometry instead of among it.
    """

    direction: int = 0
    summary: bool = False
    log_scale: bool = False
    shown: bool = False
    bookkeeping: bool = False
    forecast: bool = False

    def __post_init__(self) -> None:
        if self.direction not in (-1, 0, 1):
            raise ValueError(f"a metric's direction is -1, 0 or +1, got {self.direction!r}")


_INFO: dict[str, MetricInfo] = {}
_INFO_PATTERNS: dict[str, tuple[re.Pattern[str], MetricInfo]] = {}


def describe_metric(key: str, info: MetricInfo, pattern: bool = False) -> None:
    """Declare the metadata of the metric ``key`` (``pattern``: of every key the regular
    expression ``key`` matches in full, such as the rank probe's ``rank_q_eps<ε>``), for a key a
    measure produces outside :func:`register_measure` (the rank probe, the similarity and
    readout measures). A key declared exactly wins over a pattern."""
    if pattern:
        _INFO_PATTERNS[key] = (re.compile(key), info)
    else:
        _INFO[key] = info


def metric_info(key: str) -> MetricInfo:
    """The metadata of ``key``: as declared, else of the first pattern that matches it, else
    the default (no direction, not in the summary, linear scale, not shown)."""
    if key in _INFO:
        return _INFO[key]
    for regex, info in _INFO_PATTERNS.values():
        if regex.fullmatch(key):
            return info
    return MetricInfo()


def metrics_where(flag: str) -> tuple[str, ...]:
    """The declared keys whose :class:`MetricInfo` has ``flag`` (``summary``, ``log_scale``,
    ``shown``, ``bookkeeping``, ``forecast``) set: the registered measures' keys in registration
    order, then the keys declared outside it (exact ones) in declaration order."""
    measured = [key for keys in _KEYS.values() for key in keys]
    ordered = dict.fromkeys([*measured, *_INFO])
    return tuple(key for key in ordered if key in _INFO and getattr(_INFO[key], flag))


_MEASURES: dict[str, Measure] = {}
_KEYS: dict[str, tuple[str, ...]] = {}
#: name -> :class:`Measure`, in registration order (read-only view of the registry)
MEASURES: Mapping[str, Measure] = MappingProxyType(_MEASURES)
#: name -> the keys it produces, in registration order (read-only view of the registry)
ALL_METRICS: Mapping[str, tuple[str, ...]] = MappingProxyType(_KEYS)
#: former metric names -> their names now
RENAMED_METRICS: Mapping[str, str] = MappingProxyType({"eps_rank": "eps_rank_centred"})


def register_measure(
    name: str,
    keys: Sequence[str] | None = None,
    info: MetricInfo | Mapping[str, MetricInfo] | None = None,
) -> Callable[[Callable[[Tokens], Mapping[str, Any]]], Callable[[Tokens], Mapping[str, Any]]]:
    """Decorator: register ``fn(tokens) -> {key: value}`` as the measure ``name``, producing
    ``keys`` (default: the one key ``name``), with ``info``: the :class:`MetricInfo` of every
    key, or key -> its :class:`MetricInfo` (a key left out gets the default). Names and keys
    are unique across measures (they become metric names); ``all`` and former names are
    reserved."""
    produced = tuple(keys) if keys is not None else (name,)
    if isinstance(info, Mapping) and set(info) - set(produced):
        raise ValueError(
            f"probe measure {name!r}: metadata for keys it does not produce: "
            f"{sorted(set(info) - set(produced))}"
        )

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
        for key in produced:
            described = info.get(key) if isinstance(info, Mapping) else info
            describe_metric(key, described or MetricInfo())
        return fn

    return register


def unregister_measure(name: str) -> None:
    """Remove the measure ``name`` and its keys' metadata from the registry (a plug-in's, or a
    test's)."""
    for key in _KEYS[name]:
        _INFO.pop(key, None)
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
            "in callbacks.probe.isotropy.metrics.metrics"
        )
    unknown = [m for m in names if m not in _MEASURES]
    if unknown:
        raise ValueError(
            f"unknown probe metrics {unknown}; choose from {list(_KEYS)} or {ALL!r} (a new "
            "measure is registered with isoprobe.metrics.register_measure)"
        )
    return names
