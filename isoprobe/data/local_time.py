"""The time axis of a local file's series (:mod:`isoprobe.data.local`): timestamps parsed and
checked, the frequency inferred, every series put on its grid, and the seasonal period of a
frequency. Every step refuses what it cannot read with a :class:`LocalDataError` naming the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from isoprobe.data.offline import on_grid
from isoprobe.errors import IsoprobeError

#: a UTC offset (or Z) at the end of a timestamp string
_UTC_OFFSET = r"(?:Z|[+-]\d{2}:?\d{2})$"
_DAY_NS = 86_400 * 10**9

#: gluonts' seasonalities by the base unit of a frequency (``get_seasonality``)
_BASE_SEASONALITY = {"s": 3600, "min": 1440, "h": 24, "D": 1, "W": 1, "M": 12, "B": 5, "Q": 4}


class LocalDataError(IsoprobeError, ValueError):
    """A local data file that cannot be read as series; the message names the fix."""


def season_length_of(freq: str) -> int:
    """The seasonal period of a pandas frequency string as gluonts' ``get_seasonality``:
    the base unit's period divided by the multiple where it divides evenly, else 1."""
    offset = pd.tseries.frequencies.to_offset(freq)
    name = offset.name.split("-")[0]
    base = name if name in _BASE_SEASONALITY else name[0] if name[0] in "MQ" else None
    period = _BASE_SEASONALITY.get(base, 1)
    return period // offset.n if period % offset.n == 0 else 1


def parse_timestamps(values: pd.Series, file: Path, series_name: str) -> pd.DatetimeIndex:
    """Parsed timestamps of one series (naive; module docstring for UTC offsets), strictly
    increasing."""
    try:
        times = _parsed_times(values)
    except (ValueError, TypeError) as err:
        raise LocalDataError(
            f"data.path={str(file)!r}: timestamps of series {series_name!r} do not parse ({err})"
        ) from err
    steps = np.diff(times.asi8)
    if (steps == 0).any():
        at = times[1:][steps == 0][0]
        raise LocalDataError(
            f"data.path={str(file)!r}: series {series_name!r} has duplicate timestamp {at}. "
            "Keep one row per series and time step."
        )
    if (steps < 0).any():
        at = times[1:][steps < 0][0]
        raise LocalDataError(
            f"data.path={str(file)!r}: timestamps of series {series_name!r} are not sorted "
            f"({at} comes after a later one). Sort the file by id and time."
        )
    return times


def _parsed_times(values: pd.Series) -> pd.DatetimeIndex:
    """Naive timestamps: as written when they carry no UTC offset; with offsets, the local
    times when all fall at one time of day, else the UTC instants."""
    utc = pd.DatetimeIndex(pd.to_datetime(values, utc=True)).tz_convert(None)
    local = _local_times(values)
    if local is None or len(np.unique(local.asi8 % _DAY_NS)) > 1:
        return utc
    return local


def _local_times(values: pd.Series) -> pd.DatetimeIndex | None:
    """The local times of timestamps written with a UTC offset (the offset dropped); None
    for timestamps without one."""
    if isinstance(values.dtype, pd.DatetimeTZDtype):
        return pd.DatetimeIndex(values.dt.tz_localize(None))
    if pd.api.types.is_datetime64_dtype(values.dtype):
        return None
    text = values.astype(str)
    if not text.str.contains(_UTC_OFFSET).any():
        return None
    return pd.DatetimeIndex(pd.to_datetime(text.str.replace(_UTC_OFFSET, "", regex=True)))


def series_on_grid(
    parts: list[tuple[str, pd.DatetimeIndex, np.ndarray]], file: Path, freq: str | None
) -> tuple[list[np.ndarray], list[str], str]:
    """Every series on the grid of ``freq`` (None: the one frequency of all series)."""
    for name, _, values in parts:
        if not np.isfinite(values).any():
            raise LocalDataError(
                f"data.path={str(file)!r}: series {name!r} has no values (every cell empty). "
                "Remove it from the file."
            )
    if freq is None:
        freq = _common_freq(parts, file)
    series = []
    for name, times, values in parts:
        try:
            series.append(on_grid(pd.Series(times), pd.Series(values), freq))
        except ValueError as err:
            raise LocalDataError(
                f"data.path={str(file)!r}: series {name!r}: {err}. Set data.freq to the "
                "frequency the timestamps follow."
            ) from err
    return series, [name for name, _, _ in parts], freq


def _common_freq(parts: list[tuple[str, pd.DatetimeIndex, np.ndarray]], file: Path) -> str:
    """The frequency every series follows, inferred from each one's observed timestamps; an
    error naming the series of each frequency if they differ."""
    by_freq: dict[str, list[str]] = {}
    for name, times, values in parts:
        found = _infer_freq(times[np.isfinite(values)])
        if found is not None:
            by_freq.setdefault(found, []).append(name)
    if not by_freq:
        raise LocalDataError(
            f"data.path={str(file)!r}: cannot infer the frequency from the timestamps "
            "(irregular, or fewer than 3 per series). Give it, e.g. data.freq=h."
        )
    if len(by_freq) > 1:
        listed = "; ".join(f"{f}: {_some(names)}" for f, names in by_freq.items())
        raise LocalDataError(
            f"data.path={str(file)!r} mixes series of different frequencies ({listed}). One "
            "run windows one frequency: put the series of each frequency in a file of their "
            "own and run each (data.path=<file>). If they do follow one frequency and gaps "
            "misled the inference, give it: data.freq=<freq>."
        )
    return next(iter(by_freq))


def _some(names: list[str], shown: int = 5) -> str:
    """Up to ``shown`` quoted names and how many more."""
    text = ", ".join(repr(n) for n in names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _infer_freq(times: pd.DatetimeIndex) -> str | None:
    """pandas' inferred frequency of ``times``, else of its longest run without a gap (no step
    over 1.5 x the shortest); None for fewer than 3 timestamps or none found."""
    if len(times) < 3:
        return None
    if (freq := pd.infer_freq(times)) is not None:
        return freq
    steps = np.diff(times.asi8)
    cuts = np.flatnonzero(steps > 1.5 * steps.min()) + 1
    run = max(np.split(np.arange(len(times)), cuts), key=len)
    return pd.infer_freq(times[run]) if len(run) >= 3 else None
