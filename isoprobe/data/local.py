"""Your own series from a file: ``data=local data.path=<file>``.

Three kinds of file, told apart by their ending:

* ``.csv`` / ``.csv.gz`` / ``.parquet`` in **long** format: one row per observation, with an id
  column (``item_id``), a time column (``timestamp``) and a value column (``target``), the
  names of chronos-forecasting's and AutoGluon's data frames. A file with only the time and
  value columns is one series; so is any long file read with ``id_column=None``.
* the same files in **wide** format: a time column and one numeric column per series.
* ``.arrow``: the GluonTS Arrow files that chronos-forecasting's training script reads (one row
  per series, ``start`` and a list-valued ``target``; written by gluonts' ``ArrowWriter``).

``format="auto"`` decides between long and wide only when the columns leave one reading: long
when the file has the value column and either the id column or no other column; wide when it
has neither, its timestamps do not repeat and every other column holds numbers. Anything else
is an error listing the columns and the options that settle it (``format``, ``id_column``,
``target_column``).

Timestamps must be strictly increasing within a series (a duplicate or an earlier one is an
error naming the series, not silently sorted or averaged). A timestamp with a UTC offset names
an instant and is read in UTC, so an hourly series stays hourly across a daylight-saving
change; when all of a series' timestamps fall at one local time of day (daily or coarser data)
their local dates are kept instead. The frequency is inferred from each series' observed
timestamps unless given, and series of different frequencies in one file are refused (one
collection has one frequency and one seasonal period). Every series is then put on that grid,
a missing step becoming NaN for the DataModule's ``nan_policy``. A given ``freq`` is taken as
the frequency of every series. Arrow files carry no frequency: give ``freq`` or the seasonal
period defaults to 1 (``season_length`` sets it directly in every case).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from isoprobe.data.offline import on_grid
from isoprobe.data.registry import SeriesCollection, register_dataset

FORMATS = ("auto", "long", "wide")
TABLE_SUFFIXES = (".csv", ".csv.gz", ".parquet")
#: a UTC offset (or Z) at the end of a timestamp string
_UTC_OFFSET = r"(?:Z|[+-]\d{2}:?\d{2})$"
_DAY_NS = 86_400 * 10**9

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


@register_dataset(
    "local", context_length=64, prediction_length=16, offline=True, domain="local", memo=False
)
def load_local(
    path: str,
    format: str = "auto",
    id_column: str | None = "item_id",
    timestamp_column: str = "timestamp",
    target_column: str = "target",
    freq: str | None = None,
    season_length: int | None = None,
) -> SeriesCollection:
    """Series from ``path`` (module docstring); ``freq`` None = inferred from the timestamps,
    ``id_column`` None = a long file is one series."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(
            f"data.path={path!r} is not a file. Give a .csv, .csv.gz, .parquet or .arrow file "
            "(data=local data.path=/path/to/series.csv)."
        )
    if format not in FORMATS:
        raise LocalDataError(f"data.format must be one of {FORMATS}, got {format!r}")
    if file.name.lower().endswith(".arrow"):
        rows = _read_arrow(file)
        series, ids, found_freq = [values for values, _ in rows], [n for _, n in rows], freq
    else:
        frame = _read_table(file)
        if format == "auto":
            format = _format_of(frame, file, id_column, timestamp_column, target_column)
        read = _long_series if format == "long" else _wide_series
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
    """The file's table, refused with its name when it holds no rows."""
    name = file.name.lower()
    if not name.endswith(TABLE_SUFFIXES):
        raise LocalDataError(
            f"data.path={str(file)!r}: unknown file type; isoprobe reads .csv, .csv.gz, "
            ".parquet (long or wide) and .arrow (GluonTS / Chronos training files)"
        )
    try:
        if name.endswith(".parquet"):
            frame = _read_parquet(file)
        else:
            frame = pd.read_csv(file, float_precision="round_trip")  # every digit as written
    except pd.errors.EmptyDataError as err:
        raise LocalDataError(
            f"data.path={str(file)!r} is empty: no header line and no rows. Write a header "
            "(long: item_id,timestamp,target; wide: timestamp,<one name per series>) and one "
            "row per time step."
        ) from err
    if frame.empty:
        raise LocalDataError(
            f"data.path={str(file)!r} has columns {list(frame.columns)} but no rows: there is "
            "no observation to read. Add the data rows under the header."
        )
    return frame


def _read_parquet(file: Path) -> pd.DataFrame:
    """The Parquet file's table; an empty file raises pandas' ``EmptyDataError`` as a CSV does."""
    if file.stat().st_size == 0:
        raise pd.errors.EmptyDataError("a Parquet file of 0 bytes")
    return pd.read_parquet(file)


def _require(frame: pd.DataFrame, file: Path, column: str, option: str) -> None:
    if column not in frame.columns:
        raise LocalDataError(
            f"data.path={str(file)!r} has no column {column!r} (columns: "
            f"{list(frame.columns)}). Name the right one with data.{option}=<column>."
        )


def _format_of(
    frame: pd.DataFrame, file: Path, id_column: str | None, time: str, target: str
) -> str:
    """Long or wide where the columns leave one reading (module docstring), else an error
    listing the columns and the options that settle it."""
    _require(frame, file, time, "timestamp_column")
    others = [c for c in frame.columns if c not in (time, target, id_column)]
    if target in frame.columns:
        if id_column is None or id_column in frame.columns or not others:
            return "long"
        raise _no_id_column(frame, file, id_column, others, or_wide=True)
    if id_column in frame.columns:  # a long file whose value column has another name
        _require(frame, file, target, "target_column")
    text_columns = [c for c in others if not _holds_numbers(frame[c])]
    if not text_columns and frame[time].is_unique:
        return "wide"
    why = f"{text_columns} hold text" if text_columns else f"timestamps in {time!r} repeat"
    raise LocalDataError(
        f"data.path={str(file)!r}: cannot tell whether the file is long or wide: it has "
        f"neither the value column {target!r} nor the id column {id_column!r}, and {why} "
        f"(columns: {list(frame.columns)}). Long (one row per observation): set "
        "data.format=long data.id_column=<column naming the series> "
        "data.target_column=<column of values>. Wide (a time column and one column per "
        "series): set data.format=wide."
    )


def _no_id_column(
    frame: pd.DataFrame, file: Path, id_column: str, others: list[str], or_wide: bool
) -> LocalDataError:
    """The error for a long file without ``id_column`` but with ``others`` columns that could
    tell its series apart."""
    wide = ", or data.format=wide if every column but the time is a series" if or_wide else ""
    return LocalDataError(
        f"data.path={str(file)!r} has no id column {id_column!r} (columns: "
        f"{list(frame.columns)}). Name the column that tells the series apart with "
        f"data.id_column=<column> (one of {others}), set data.id_column=null to read the "
        f"whole file as one series{wide}."
    )


def _holds_numbers(values: pd.Series) -> bool:
    """Whether a column is numeric or at least half of its non-empty cells are numbers (a
    column of numbers with a stray typo still counts; ``_numeric`` then names the typo)."""
    filled = values.dropna().astype(str).str.strip()
    filled = filled[filled != ""]
    if pd.api.types.is_numeric_dtype(values) or filled.empty:
        return True
    return bool(pd.to_numeric(filled, errors="coerce").notna().mean() >= 0.5)


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


def _grid(
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


def _long_series(
    frame: pd.DataFrame,
    file: Path,
    id_column: str | None,
    time: str,
    target: str,
    freq: str | None,
) -> tuple[list[np.ndarray], list[str], str]:
    _require(frame, file, target, "target_column")
    _require(frame, file, time, "timestamp_column")
    values = _numeric(frame[target], file, f"column {target!r}")
    ids = _series_ids(frame, file, id_column, time, target)
    parts = []
    for name, rows in frame.groupby(ids.to_numpy(), sort=False).indices.items():
        parts.append((str(name), _timestamps(frame[time].iloc[rows], file, name), values[rows]))
    return _grid(parts, file, freq)


def _series_ids(
    frame: pd.DataFrame, file: Path, id_column: str | None, time: str, target: str
) -> pd.Series:
    """The series each row of a long file belongs to: its id column, or one series when
    ``id_column`` is None or the file has no column besides time and value."""
    if id_column in frame.columns:
        return frame[id_column].astype(str)
    others = [c for c in frame.columns if c not in (time, target)]
    if id_column is not None and others:
        raise _no_id_column(frame, file, id_column, others, or_wide=False)
    return pd.Series("0", index=frame.index)


def _wide_series(
    frame: pd.DataFrame,
    file: Path,
    id_column: str | None,
    time: str,
    target: str,
    freq: str | None,
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
