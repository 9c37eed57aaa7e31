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

from isoprobe.data.local_time import (
    LocalDataError,
    parse_timestamps,
    season_length_of,
    series_on_grid,
)
from isoprobe.data.registry import SeriesCollection, register_dataset

FORMATS = ("auto", "long", "wide")
TABLE_SUFFIXES = (".csv", ".csv.gz", ".parquet")


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
        times = parse_timestamps(frame[time].iloc[rows], file, name)
        parts.append((str(name), times, values[rows]))
    return series_on_grid(parts, file, freq)


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
    times = parse_timestamps(frame[time], file, "(all columns)")
    parts = [(str(c), times, _numeric(frame[c], file, f"column {c!r}")) for c in columns]
    return series_on_grid(parts, file, freq)


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
