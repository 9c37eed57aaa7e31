"""The measure sets ``callbacks.probe.measures`` names, and the options each one takes (the
key of the same name in ``callbacks.probe``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from isoprobe.probing.isotropy import IsotropyMeasures
from isoprobe.probing.measure_set import MeasureSet
from isoprobe.probing.rank import RankMeasures
from isoprobe.probing.readout import ReadoutMeasures
from isoprobe.probing.similarity import SimilarityMeasures

#: name in ``callbacks.probe.measures`` -> the measure set it runs
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
    isotropy measures also take the probe's ``seed``)."""
    unknown = [name for name in names if name not in MEASURE_SETS]
    if unknown or not names:
        raise ValueError(
            f"callbacks.probe.measures must name some of {list(MEASURE_SETS)}, got {list(names)}"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"callbacks.probe.measures names a set twice: {list(names)}")
    sets: dict[str, MeasureSet] = {}
    for name in names:
        given = dict(options.get(name) or {})
        if name == "isotropy":
            given.setdefault("seed", seed)
        sets[name] = MEASURE_SETS[name](**given)
    return sets
