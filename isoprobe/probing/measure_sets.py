"""The measure sets ``callbacks.probe.measures`` names: the built-in ones, each with its options
(the key of the same name in ``callbacks.probe``), and any registered measure of the ``pair``,
``windows`` or ``weights`` kind, by its name, with its parameters under the same key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from isoprobe.metrics.registry import MEASURES, TOKENS
from isoprobe.probing.isotropy import IsotropyMeasures
from isoprobe.probing.measure_kinds import registered_measure_set
from isoprobe.probing.measure_set import MeasureSet
from isoprobe.probing.rank import RankMeasures
from isoprobe.probing.readout import ReadoutMeasures
from isoprobe.probing.similarity import SimilarityMeasures

#: name in ``callbacks.probe.measures`` -> the built-in measure set it runs
MEASURE_SETS: dict[str, type[MeasureSet]] = {
    "isotropy": IsotropyMeasures,
    "rank": RankMeasures,
    "cka": SimilarityMeasures,
    "readout": ReadoutMeasures,
}


def build_measure_sets(
    names: Sequence[str], options: Mapping[str, Mapping[str, Any] | None], seed: int
) -> dict[str, MeasureSet]:
    """Name -> measure set for ``names`` in order, each built from ``options[name]`` (the
    isotropy measures also take the probe's ``seed``): a built-in set of
    :data:`MEASURE_SETS`, else the registered measure of that name run on its own. The options
    of a built-in set that ``names`` leaves out are not read; any other option must belong to
    a named measure."""
    known = [*MEASURE_SETS, *(m for m in MEASURES if MEASURES[m].kind != TOKENS)]
    unknown = [name for name in names if name not in MEASURE_SETS and name not in MEASURES]
    if unknown or not names:
        raise ValueError(
            f"callbacks.probe.measures must name some of {known}, got {list(names)} (a measure "
            "of your own is registered with isoprobe.metrics.register_measure in a module named "
            "in callbacks.probe.plugins)"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"callbacks.probe.measures names a set twice: {list(names)}")
    stray = sorted(set(options) - set(names) - set(MEASURE_SETS))
    if stray:
        raise ValueError(
            f"callbacks.probe has no setting {stray}: it is neither a setting of the probe nor "
            f"a measure named in callbacks.probe.measures ({list(names)})"
        )
    sets: dict[str, MeasureSet] = {}
    for name in names:
        given = dict(options.get(name) or {})
        if name in MEASURE_SETS:
            if name == "isotropy":
                given.setdefault("seed", seed)
            sets[name] = MEASURE_SETS[name](**given)
        else:
            measure = MEASURES[name]
            params = measure.parameters(given, f"callbacks.probe.{name}")
            sets[name] = registered_measure_set(measure, params)
    return sets
