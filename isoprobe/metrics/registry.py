"""The registry of the probe's measures, of four kinds by what they read, and of every metric
key's metadata (:class:`MetricInfo`), which the run's summary table, the probe's plots and
``task=analyze`` read: no metric name is written anywhere else.

A measure is registered where its function is defined, with :func:`register_measure`, which
names its kind (what the probe hands it), its keys (the metric names of its rows) and, if it
takes any, its parameters as a dataclass. The kinds (:data:`KINDS`), one row per key and:

- ``tokens`` -- per probed layer, ``fn(tokens)``: one token set, the layer's
  :class:`isoprobe.metrics.suite.Tokens` (the matrix [N, D] and the intermediates every such
  measure shares). They run in the ``isotropy`` measures, chosen with
  ``callbacks.probe.isotropy.metrics.metrics`` (``all``: every one registered).
- ``pair`` -- per probed layer, ``fn(a, b)``: two token sets on the same rows, which the probe
  pairs as the measure's ``pairing`` says (:data:`PAIRINGS`): ``drift``, the layer now (a)
  against the same layer at step 0 (b); ``prev``, the layer (a) against the layer probed just
  before it on the same tokens (b; ``embed`` before a stack's first block).
- ``windows`` -- per probed layer, ``fn(features, targets)``: each probe window's mean real
  token [W, D] with its horizon scaled by its context [W, H] (float64, probe-set order, NaN
  where a window has no real token or a missing target value).
- ``weights`` -- per attention block, ``fn(projections)``: projection name (q, k, v, o) -> the
  block's matrix (a decoder block's cross-attention as block ``<block>.cross``).

A measure with parameters gets them as the last argument, built from its options in the
config. A ``pair``, ``windows`` or ``weights`` measure runs when ``callbacks.probe.measures``
names it, with its options under ``callbacks.probe.<name>``; the built-in measure sets
(``cka``, ``readout``, ``rank``) run the built-in ones. A user's module registers its own and
is named in ``callbacks.probe.plugins``: nothing inside isoprobe is edited::

    @register_measure("procrustes_drift", kind="pair", pairing="drift")
    def procrustes_drift(now: Tensor, before: Tensor) -> dict[str, float]:
        ...
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from types import MappingProxyType
from typing import Any

from torch import Tensor

#: the selection that means every registered ``tokens`` measure
ALL = "all"
TOKENS, PAIR, WINDOWS, WEIGHTS = "tokens", "pair", "windows", "weights"
#: what a measure reads (module docstring)
KINDS = (TOKENS, PAIR, WINDOWS, WEIGHTS)
DRIFT, PREVIOUS = "drift", "prev"
#: which two token sets a ``pair`` measure reads (module docstring)
PAIRINGS = (DRIFT, PREVIOUS)
ISOTROPY_OUTPUT, RANK_OUTPUT = "isotropy", "rank"


@dataclass(frozen=True)
class Measure:
    """A registered measure (:func:`register_measure`): ``fn`` of the inputs its ``kind``
    reads, producing exactly ``keys`` or, with ``key_pattern``, keys that match it."""

    name: str
    keys: tuple[str, ...]
    fn: Callable[..., Mapping[str, Any]]
    kind: str = TOKENS
    params: type | None = None
    prepare: Callable[[Tensor], Any] | None = None
    pairing: str | None = None
    output: str = ISOTROPY_OUTPUT
    key_pattern: str | None = None

    def parameters(self, options: Mapping[str, Any] | None, setting: str) -> Any:
        """Its parameters (an instance of :attr:`params`) from ``options``, the mapping at
        ``setting`` in the config; None for a measure that takes none. An option the dataclass
        does not have is refused, naming ``setting`` and the options it has."""
        options = dict(options or {})
        known = [f.name for f in fields(self.params)] if self.params is not None else []
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(
                f"{setting}: the measure {self.name!r} has no option(s) {unknown}; its options "
                f"are {known or 'none'}"
            )
        return None if self.params is None else self.params(**options)

    def prepared(self, matrix: Tensor) -> Any:
        """``matrix`` as ``fn`` reads it (:attr:`prepare`'s result, or itself)."""
        return matrix if self.prepare is None else self.prepare(matrix)

    def __call__(self, *inputs: Any, params: Any = None) -> dict[str, float]:
        """``fn`` of ``inputs`` (and ``params`` where it takes parameters) as floats (in key
        order where it declared its keys); a measure that returns other keys than it declared
        is refused."""
        values = self.fn(*inputs) if self.params is None else self.fn(*inputs, params)
        if self.key_pattern is None and set(values) != set(self.keys):
            raise RuntimeError(
                f"probe measure {self.name!r} returned keys {sorted(values)}, not the keys it "
                f"was registered with, {list(self.keys)}"
            )
        if self.key_pattern is not None:
            stray = [key for key in values if not re.fullmatch(self.key_pattern, key)]
            if stray:
                raise RuntimeError(
                    f"probe measure {self.name!r} returned keys {stray}, which do not match "
                    f"its key pattern {self.key_pattern!r}"
                )
            return {key: float(value) for key, value in values.items()}
        return {key: float(values[key]) for key in self.keys}


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
#: name -> :class:`Measure` of every kind, in registration order (read-only view)
MEASURES: Mapping[str, Measure] = MappingProxyType(_MEASURES)
#: name -> the keys it produces, of the ``tokens`` measures, in registration order (read-only
#: view): what ``metrics: all`` of the isotropy measures runs
ALL_METRICS: Mapping[str, tuple[str, ...]] = MappingProxyType(_KEYS)
#: former metric names -> their names now
RENAMED_METRICS: Mapping[str, str] = MappingProxyType({"eps_rank": "eps_rank_centred"})


def register_measure(
    name: str,
    keys: Sequence[str] | None = None,
    info: MetricInfo | Mapping[str, MetricInfo] | None = None,
    *,
    key_pattern: str | None = None,
    kind: str = TOKENS,
    params: type | None = None,
    prepare: Callable[[Tensor], Any] | None = None,
    pairing: str | None = None,
    output: str | None = None,
) -> Callable[[Callable[..., Mapping[str, Any]]], Callable[..., Mapping[str, Any]]]:
    """Decorator: register ``fn`` as the measure ``name`` of ``kind`` (:data:`KINDS`; what
    ``fn`` reads is in the module docstring), producing ``keys`` (default: the one key
    ``name``), with ``info``: the :class:`MetricInfo` of every key, or key -> its
    :class:`MetricInfo` (a key left out gets the default). A measure whose parameters or
    inputs decide its keys (``rank_<projection>_eps<ε>``) gives ``key_pattern`` instead, a
    regular expression every key it returns matches in full, and ``info`` for all of them.

    ``params``: a dataclass of the measure's parameters, built from its options in the config
    (an unknown option is refused) and passed to ``fn`` as its last argument; without one,
    ``fn`` takes its inputs alone. ``prepare``: a function of one input matrix whose result
    ``fn`` reads instead (a ``pair`` measure's side prepared once for every pairing, a
    ``weights`` measure's singular values). ``pairing`` (``pair`` only): which two token sets
    the probe pairs, :data:`PAIRINGS`. ``output``: the output group its rows go to
    (``isotropy`` or ``rank``; default ``rank`` for ``weights``, else ``isotropy``).

    Names and static keys are unique across measures (they become metric names); ``all`` and
    former names are reserved."""
    if kind not in KINDS:
        raise ValueError(f"probe measure {name!r}: kind must be one of {KINDS}, got {kind!r}")
    if (kind == PAIR) != (pairing is not None) or (pairing is not None and pairing not in PAIRINGS):
        raise ValueError(
            f"probe measure {name!r}: a pair measure names its pairing, one of {PAIRINGS}, and "
            f"no other kind does (kind {kind!r}, pairing {pairing!r})"
        )
    if params is not None and not is_dataclass(params):
        raise TypeError(f"probe measure {name!r}: params must be a dataclass, got {params!r}")
    if key_pattern is not None and (keys is not None or isinstance(info, Mapping)):
        raise ValueError(
            f"probe measure {name!r}: give its keys or a key pattern with one MetricInfo for "
            "every key it matches, not both"
        )
    static = () if key_pattern is not None else tuple(keys) if keys is not None else (name,)
    if isinstance(info, Mapping) and set(info) - set(static):
        raise ValueError(
            f"probe measure {name!r}: metadata for keys it does not produce: "
            f"{sorted(set(info) - set(static))}"
        )

    def register(fn: Callable[..., Mapping[str, Any]]) -> Callable[..., Mapping[str, Any]]:
        if name == ALL or name in RENAMED_METRICS or name in _MEASURES:
            raise ValueError(f"probe measure name {name!r} is taken; registered: {list(_MEASURES)}")
        taken = {key for existing in _MEASURES.values() for key in existing.keys}
        clash = [key for key in static if key in taken]
        if (not static and key_pattern is None) or clash or len(set(static)) < len(static):
            raise ValueError(
                f"probe measure {name!r}: its keys {list(static)} must be distinct, new and at "
                f"least one (already produced by other measures: {clash})"
            )
        group = output or (RANK_OUTPUT if kind == WEIGHTS else ISOTROPY_OUTPUT)
        _MEASURES[name] = Measure(
            name, static, fn, kind, params, prepare, pairing, group, key_pattern
        )
        if kind == TOKENS:
            _KEYS[name] = static
        if key_pattern is not None:
            describe_metric(key_pattern, info or MetricInfo(), pattern=True)
        for key in static:
            described = info.get(key) if isinstance(info, Mapping) else info
            describe_metric(key, described or MetricInfo())
        return fn

    return register


def unregister_measure(name: str) -> None:
    """Remove the measure ``name`` and its keys' metadata from the registry (a plug-in's, or a
    test's)."""
    measure = _MEASURES.pop(name)
    for key in measure.keys:
        _INFO.pop(key, None)
    if measure.key_pattern is not None:
        _INFO_PATTERNS.pop(measure.key_pattern, None)
    _KEYS.pop(name, None)


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
    unknown = [m for m in names if m not in _KEYS]
    if unknown:
        raise ValueError(
            f"unknown probe metrics {unknown}; choose from {list(_KEYS)} or {ALL!r} (a new "
            "measure is registered with isoprobe.metrics.register_measure)"
        )
    return names
