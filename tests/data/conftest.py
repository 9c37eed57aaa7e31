"""A registered data set whose series each test passes in: ``dataset_kwargs={"series": [...]}``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from isoprobe.data.registry import SeriesCollection, register_dataset

GIVEN = "tests/given_series"


@register_dataset(GIVEN, context_length=3, prediction_length=2, offline=True, domain="tests")
def load_given_series(series: Sequence[Sequence[float]]) -> SeriesCollection:
    arrays = [np.asarray(s, dtype=np.float64) for s in series]
    ids = [f"s{i}" for i in range(len(arrays))]
    return SeriesCollection(GIVEN, arrays, "D", 1, "tests", "none", ids)
