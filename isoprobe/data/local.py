"""Your own series from a file: ``data=local data.path=<file>``.

Three kinds of file, told apart by their ending:

* ``.csv`` / ``.csv.gz`` / ``.parquet`` in **long** format: one row per observation, with an id
  column (``item_id``), a time column (``timestamp``) and a value column (``target``), the
  names of chronos-forecasting's and AutoGluon's data frames. Without the id column the whole
  file is one series.
* the same files in **wide** format: a time column and one numeric column per series.
  ``layout=auto`` reads a file with the target column as long, any other as wide.
* ``.arrow``: the GluonTS Arrow files that chronos-forecasting's training script reads (one row
  per series, ``start`` and a list-valued ``target``; written by gluonts' ``ArrowWriter``).

Timestamps must be strictly increasing within a series (a duplicate or an earlier one is an
error naming the series, not silently sorted or averaged). The frequency is inferred from them
unless given; the series is then put on that grid, a missing step becoming NaN for the
DataModule's ``nan_policy``. Arrow files carry no frequency: give ``freq`` or the seasonal
period defaults to 1 (``season_length`` sets it directly in every case).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from isoprobe.data.offline import on_grid
from isoprobe.data.registry import SeriesCollection, register_dataset

LAYOUTS = ("auto", "long", "wide")
TABLE_SUFFIXES = (".csv", ".csv.gz", ".parquet")

#: gluonts' seasonalities by the base unit of a frequency (``get_seasonality``)
_BASE_SEASONALITY = {"s": 3600, "min": 1440, "h": 24, "D": 1, "W": 1, "M": 12, "B": 5, "Q": 4}


class LocalDataError(ValueError):
    """A local data file that cannot be read as series; the message names the fix."""


def season_length_of(freq: str) -> int:
    """The seasonal period of a pandas frequency string as gluonts' ``get_seasonality``:
    the base unit's period divided by the multiple where it divides evenly, else 1."""
    offset = pd.tseries.frequencies.to_offset(freq)
    name = offset.name.split("-")[0]
    base = name if name in _BASE_SEASONALITY else name[0] if name[0] in "MQ" else None
    period = _BASE_SEASONALITY.get(base, 1)
    return period // offset.n if period % offset.n == 0 else 1


@register_dataset("local", context_length=64, prediction_length=16, offline=True, domain="local")
def load_local(
    path: str,
    layout: str = "auto",
    id_column: str = "item_id",
    timestamp_column: str = "timestamp",
    target_column: str = "target",
    freq: str | None = None,
    season_length: int | None = None,
) -> SeriesCollection:
    """Series from ``path`` (module docstring); ``freq`` None = inferred from the timestamps."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"data.path={path!r} is not a file. Give a .csv, .csv.gz, .parquet or .arrow file "
            "(data=local data.path=/path/to/series.csv)."
        )
    if layout not in LAYOUTS:
        raise LocalDataError(f"data.layout must be one of {LAYOUTS}, got {layout!r}")
    if file.name.lower().endswith(".arrow"):
        rows = _read_arrow(file)
        series, ids, found_freq = [values for values, _ in rows], [n for _, n in rows], freq
    else:
        frame = _read_table(file)
        long = layout == "long" or (layout == "auto" and target_column in frame.columns)
        read = _long_series if long else _wide_series
        series, ids, found_freq = read(
            frame, file, id_column, timestamp_column, target_column, freq=freq
        )
    if season_length is None:
        season_length = season_length_of(found_freq) if found_freq else 1
    return SeriesCollection(
        "local",
        series,
        found_freq or "unknown",
        int(season_length),
        f"local file {file}",
        "the user's own",
        ids,
    )


def _read_table(file: Path) -> pd.DataFrame:
    name = file.name.lower()
    if not name.endswith(TABLE_SUFFIXES):
        raise LocalDataError(
            f"data.path={str(file)!r}: unknown file type; isoprobe reads .csv, .csv.gz, "
            ".parquet (long or wide) and .arrow (GluonTS / Chronos training files)"
        )
    if name.endswith(".parquet"):
        return pd.read_parquet(file)
    return pd.read_csv(file, float_precision="round_trip")  # every digit as written


def _require(frame: pd.DataFrame, file: Path, column: str, option: str) -> None:
    if column not in frame.columns:
        raise LocalDataError(
            f"data.path={str(file)!r} has no column {column!r} (columns: "
            f"{list(frame.columns)}). Name the right one with data.{option}=<column>."
        )


def _numeric(values: pd.Series, file: Path, what: str) -> np.ndarray:
    """float64 values; empty cells become NaN, any other non-number is an error naming it."""
    numbers = pd.to_numeric(values, errors="coerce")
    bad = numbers.isna() & values.notna()
    if values.dtype == object:
        bad &= values.astype(str).str.strip().ne("")
    if bad.any():
        first = values[bad].iloc[0]
        raise LocalDataError(
            f"data.path={str(file)!r}: {int(bad.sum())} non-numeric value(s) in {what}, "
            f"e.g. {first!r} at row {values[bad].index[0]}. Clean the file (an empty cell "
            "is read as a missing value)."
        )
    return numbers.to_numpy(dtype=np.float64)


def _timestamps(values: pd.Series, file: Path, series_name: str) -> pd.DatetimeIndex:
    """Parsed timestamps of one series, strictly increasing."""
    try:
        times = pd.DatetimeIndex(pd.to_datetime(values))
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


def _grid(
    parts: list[tuple[str, pd.DatetimeIndex, np.ndarray]], file: Path, freq: str | None
) -> tuple[list[np.ndarray], list[str], str]:
    """Every series on the grid of ``freq`` (inferred from the longest series if None)."""
    if freq is None:
        freq = _infer_freq([times for _, times, _ in parts])
        if freq is None:
            raise LocalDataError(
                f"data.path={str(file)!r}: cannot infer the frequency from the timestamps "
                "(irregular, or fewer than 3). Give it, e.g. data.freq=h."
            )
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


def _infer_freq(stamps: list[pd.DatetimeIndex]) -> str | None:
    """pandas' inferred frequency of the first series (longest first) that has one, else of
    the longest run without a gap (no step over 1.5 x the shortest) of the longest series."""
    stamps = sorted(stamps, key=len, reverse=True)
    for times in stamps:
        if len(times) >= 3 and (freq := pd.infer_freq(times)) is not None:
            return freq
    times = stamps[0]
    if len(times) < 3:
        return None
    steps = np.diff(times.asi8)
    cuts = np.flatnonzero(steps > 1.5 * steps.min()) + 1
    run = max(np.split(np.arange(len(times)), cuts), key=len)
    return pd.infer_freq(times[run]) if len(run) >= 3 else None


def _long_series(
    frame: pd.DataFrame, file: Path, id_column: str, time: str, target: str, freq: str | None
) -> tuple[list[np.ndarray], list[str], str]:
    _require(frame, file, target, "target_column")
    _require(frame, file, time, "timestamp_column")
    values = _numeric(frame[target], file, f"column {target!r}")
    ids = (
        frame[id_column].astype(str) if id_column in frame.columns else pd.Series("0", frame.index)
    )
    parts = []
    for name, rows in frame.groupby(ids.to_numpy(), sort=False).indices.items():
        parts.append((str(name), _timestamps(frame[time].iloc[rows], file, name), values[rows]))
    return _grid(parts, file, freq)


def _wide_series(
    frame: pd.DataFrame, file: Path, id_column: str, time: str, target: str, freq: str | None
) -> tuple[list[np.ndarray], list[str], str]:
    _require(frame, file, time, "timestamp_column")
    columns = [c for c in frame.columns if c != time]
    if not columns:
        raise LocalDataError(f"data.path={str(file)!r} has a time column and no series column")
    times = _timestamps(frame[time], file, "(all columns)")
    parts = [(str(c), times, _numeric(frame[c], file, f"column {c!r}")) for c in columns]
    return _grid(parts, file, freq)


def _read_arrow(file: Path) -> list[tuple[np.ndarray, str]]:
    """(values, id) of every row of a GluonTS Arrow file (IPC file or stream format)."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(file)) as source:
            table = pa.ipc.open_file(source).read_all()
    except pa.ArrowInvalid:
        try:
            with pa.memory_map(str(file)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid as err:
            raise LocalDataError(
                f"data.path={str(file)!r} is not an Arrow IPC file ({err}); isoprobe reads "
                "the files of gluonts' ArrowWriter (chronos-forecasting's training data)"
            ) from err
    if "target" not in table.column_names:
        raise LocalDataError(
            f"data.path={str(file)!r} has no 'target' column (columns: {table.column_names}); "
            "GluonTS Arrow files hold one series per row in 'target'"
        )
    targets = table.column("target").to_pylist()
    names = table.column("item_id").to_pylist() if "item_id" in table.column_names else None
    rows = []
    for i, target in enumerate(targets):
        name = str(names[i]) if names is not None else str(i)
        values = pd.Series(target, dtype=object)
        rows.append((_numeric(values, file, f"series {name!r}"), name))
    return rows
