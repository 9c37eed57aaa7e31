"""The twelve offline real data sets load from installed packages with the expected layout."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from gluonts.time_feature import get_seasonality

from isoprobe.data import available_datasets, dataset_spec, load_series
from isoprobe.data.offline import on_grid

# name: (domain, pandas frequency, number of series), from each set's source
EXPECTED = {
    "vic_elec": ("energy", "30min", 1),
    "epf_prices": ("energy", "h", 2),
    "seattle_weather": ("weather", "D", 1),
    "sea_surface_temperature": ("weather", "30min", 1),
    "stocks": ("finance", "B", 4),
    "gafa_stock": ("finance", "B", 4),
    "glucose": ("healthcare", "5min", 1),
    "pbs": ("healthcare", "MS", 336),
    "pedestrian": ("transport", "h", 4),
    "ansett": ("transport", "W-MON", 30),
    "aus_retail": ("retail", "MS", 152),
    "us_retail_employment": ("retail", "MS", 15),
}


def test_importing_isoprobe_data_registers_every_family():
    names = set(available_datasets())
    assert {"kernelsynth/mixed", "hospital", "vic_elec"} <= names
    assert "hospital" not in available_datasets(offline_only=True)


def test_every_offline_real_set_is_registered():
    offline = {
        n
        for n in available_datasets(offline_only=True)
        if dataset_spec(n).domain
        in {"energy", "weather", "finance", "healthcare", "transport", "retail"}
    }
    assert offline == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_offline_set_loads_with_its_frequency(name):
    domain, freq, count = EXPECTED[name]
    spec = dataset_spec(name)
    assert spec.offline and spec.domain == domain
    data = load_series(name)
    assert data.name == name and data.freq == freq
    pd.tseries.frequencies.to_offset(data.freq)  # a valid pandas frequency
    assert data.season_length == get_seasonality(freq)
    assert len(data.series) == count == len(data.item_ids) == len(set(data.item_ids))
    for values in data.series:
        assert values.dtype == np.float64 and values.ndim == 1 and len(values) > 0
        assert np.isfinite(values[0]) and np.isfinite(values[-1])  # gridded from first to last
    window = spec.context_length + spec.prediction_length
    assert max(len(values) for values in data.series) > window
    assert data.source and data.license


def test_on_grid_marks_missing_steps_and_refuses_off_grid_times():
    times = pd.Series(pd.to_datetime(["2020-01-01", "2020-01-02", "2020-01-04", "2020-01-02"]))
    values = pd.Series([1.0, 2.0, 4.0, 4.0])
    np.testing.assert_array_equal(on_grid(times, values, "D"), [1.0, 3.0, np.nan, 4.0])
    with pytest.raises(ValueError, match="1 timestamps are not on the 'D' grid"):
        on_grid(
            pd.Series(pd.to_datetime(["2020-01-01T00:00", "2020-01-02T12:00"])), values[:2], "D"
        )
