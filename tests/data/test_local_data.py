"""`data=local data.path=<file>`: long and wide CSV/Parquet and GluonTS Arrow files, checked
against the values written, and a clear error for each kind of bad file."""

from __future__ import annotations

import gzip
import re

import numpy as np
import pandas as pd
import pytest
from gluonts.dataset.arrow import ArrowWriter
from gluonts.time_feature import get_seasonality
from hydra.utils import instantiate

from isoprobe.data import LocalDataModule
from isoprobe.data.local import LocalDataError, load_local, season_length_of
from tests.conftest import data_config

RNG = np.random.default_rng(0)
A = RNG.normal(size=400).cumsum()
B = RNG.normal(size=100).cumsum()


def long_frame() -> pd.DataFrame:
    """Two hourly series of different lengths in chronos-forecasting's long layout."""
    times_a = pd.date_range("2024-01-01", periods=len(A), freq="h")
    times_b = pd.date_range("2024-02-01", periods=len(B), freq="h")
    return pd.concat(
        [
            pd.DataFrame({"item_id": "a", "timestamp": times_a, "target": A}),
            pd.DataFrame({"item_id": "b", "timestamp": times_b, "target": B}),
        ],
        ignore_index=True,
    )


def check_two_series(collection) -> None:
    assert collection.item_ids == ["a", "b"]
    np.testing.assert_array_equal(collection.series[0], A)
    np.testing.assert_array_equal(collection.series[1], B)
    assert collection.freq == "h" and collection.season_length == 24


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_long_files_give_each_series_exactly(tmp_path, suffix):
    path = tmp_path / f"series{suffix}"
    frame = long_frame()
    frame.to_parquet(path) if suffix == ".parquet" else frame.to_csv(path, index=False)
    check_two_series(load_local(str(path)))


def test_wide_file_gives_one_series_per_column(tmp_path):
    times = pd.date_range("2024-01-01", periods=len(B), freq="h")
    path = tmp_path / "wide.csv"
    pd.DataFrame({"timestamp": times, "a": A[: len(B)], "b": B}).to_csv(path, index=False)
    collection = load_local(str(path))
    assert collection.item_ids == ["a", "b"]
    np.testing.assert_array_equal(collection.series[0], A[: len(B)])
    np.testing.assert_array_equal(collection.series[1], B)


def test_other_column_names_and_a_given_frequency(tmp_path):
    frame = long_frame().rename(columns={"item_id": "id", "timestamp": "ds", "target": "y"})
    path = tmp_path / "renamed.parquet"
    frame.to_parquet(path)
    collection = load_local(
        str(path), id_column="id", timestamp_column="ds", target_column="y", freq="h"
    )
    check_two_series(collection)


def test_a_missing_step_becomes_nan_for_the_nan_policy(tmp_path):
    frame = long_frame().drop(index=[10, 11])
    path = tmp_path / "gap.csv"
    frame.to_csv(path, index=False)
    first = load_local(str(path)).series[0]
    assert len(first) == len(A) and np.isnan(first[10:12]).all()
    np.testing.assert_array_equal(first[12:], A[12:])


def test_gluonts_arrow_file_as_chronos_training_reads_it(tmp_path):
    path = tmp_path / "train.arrow"
    start = pd.Period("2024-01-01", freq="h")
    ArrowWriter(compression="lz4").write_to_file(
        [{"start": start, "target": A}, {"start": start, "target": B}], path
    )
    collection = load_local(str(path), freq="h")
    assert collection.item_ids == ["0", "1"] and collection.season_length == 24
    np.testing.assert_array_equal(collection.series[0], A)
    np.testing.assert_array_equal(collection.series[1], B)
    assert load_local(str(path)).season_length == 1  # no frequency in the file, none given


@pytest.mark.parametrize("freq", ["30min", "5min", "7min", "h", "2h", "D", "W", "B", "MS", "QS"])
def test_season_length_agrees_with_gluonts(freq):
    assert season_length_of(freq) == get_seasonality(freq)


def write(tmp_path, frame: pd.DataFrame) -> str:
    path = tmp_path / "bad.csv"
    frame.to_csv(path, index=False)
    return str(path)


def test_a_missing_column_is_named_with_the_option_that_fixes_it(tmp_path):
    path = write(tmp_path, long_frame().drop(columns="timestamp"))
    with pytest.raises(LocalDataError, match=r"no column 'timestamp'.*data.timestamp_column"):
        load_local(path)


def test_non_numeric_values_are_refused_with_an_example(tmp_path):
    frame = long_frame().astype({"target": object})
    frame.loc[7, "target"] = "n/a?"
    with pytest.raises(LocalDataError, match=r"1 non-numeric value.*'n/a\?' at row 7"):
        load_local(write(tmp_path, frame))


def test_duplicate_timestamps_are_refused(tmp_path):
    frame = long_frame()
    frame.loc[5, "timestamp"] = frame.loc[4, "timestamp"]
    with pytest.raises(LocalDataError, match="series 'a' has duplicate timestamp"):
        load_local(write(tmp_path, frame))


def test_unsorted_timestamps_are_refused(tmp_path):
    frame = long_frame()
    frame.iloc[[3, 4]] = frame.iloc[[4, 3]].to_numpy()
    with pytest.raises(LocalDataError, match="series 'a' are not sorted"):
        load_local(write(tmp_path, frame))


def test_an_unknown_file_type_and_a_missing_file_are_named(tmp_path):
    (tmp_path / "series.xlsx").write_text("x")
    with pytest.raises(LocalDataError, match="unknown file type"):
        load_local(str(tmp_path / "series.xlsx"))
    with pytest.raises(FileNotFoundError, match="is not a file"):
        load_local(str(tmp_path / "absent.csv"))


def local_datamodule(path, **overrides) -> LocalDataModule:
    return instantiate(data_config("local", seed=0, **overrides), path=str(path))


def test_local_config_windows_the_file_like_every_other_set(tmp_path):
    path = tmp_path / "series.csv"
    long_frame().to_csv(path, index=False)
    dm = local_datamodule(path, context_length=32, prediction_length=8)
    dm.setup("fit")
    assert dm.freq == "h" and dm.season_length == 24
    batch = next(iter(dm.val_dataloader()))
    assert batch["context"].shape[1:] == (32,) and batch["target"].shape[1:] == (8,)
    assert dm.report["series_total"] == 2 and min(dm.report["windows"].values()) > 0


def test_a_series_shorter_than_one_window_is_named(tmp_path):
    path = tmp_path / "series.csv"
    long_frame().to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"shorter than one window.*\['b'\] with lengths \[100\]"):
        local_datamodule(path, context_length=96, prediction_length=12).setup("fit")
    skipping = local_datamodule(path, context_length=96, prediction_length=12, short_series="skip")
    skipping.setup("fit")
    assert skipping.report["series_too_short"] == 1


def test_the_frequency_is_inferred_despite_a_gap_in_the_only_series(tmp_path):
    frame = long_frame()
    frame = frame[frame.item_id == "a"].drop(index=[10, 11]).drop(columns="item_id")
    path = tmp_path / "one.csv"
    frame.to_csv(path, index=False)
    collection = load_local(str(path))
    assert collection.freq == "h" and collection.item_ids == ["0"]
    assert np.isnan(collection.series[0][10:12]).all()


def save(frame: pd.DataFrame, path) -> str:
    """``frame`` written to ``path`` as Parquet or CSV (gzip by the ending), as a user would."""
    frame.to_parquet(path) if path.suffix == ".parquet" else frame.to_csv(path, index=False)
    return str(path)


TABLES = ["long.csv", "long.parquet"]


@pytest.mark.parametrize("name", TABLES)
def test_an_id_column_of_another_name_is_refused_not_read_as_one_series(tmp_path, name):
    path = save(long_frame().rename(columns={"item_id": "series"}), tmp_path / name)
    for options in ({}, {"format": "long"}):
        with pytest.raises(
            LocalDataError, match=r"no id column 'item_id'.*'series'.*data.id_column=<column>"
        ):
            load_local(path, **options)
    check_two_series(load_local(path, id_column="series"))
    check_two_series(load_local(path, format="long", id_column="series"))
    (whole,) = load_local(path, id_column=None).series  # asked for: the file is one series
    np.testing.assert_array_equal(whole[: len(A)], A)
    np.testing.assert_array_equal(whole[-len(B) :], B)


@pytest.mark.parametrize("name", TABLES)
def test_a_wrong_id_column_is_named_with_the_option(tmp_path, name):
    path = save(long_frame(), tmp_path / name)
    for options in ({}, {"format": "long"}):
        with pytest.raises(
            LocalDataError, match=r"no id column 'sensor'.*\['item_id'\].*data.id_column"
        ):
            load_local(path, id_column="sensor", **options)


def overlapping_items_numbered() -> pd.DataFrame:
    """Two hourly series with integer ids whose times overlap, value column named 'value'."""
    frame = long_frame().rename(columns={"target": "value"})
    frame["item_id"] = frame["item_id"].map({"a": 1, "b": 2})
    frame.loc[frame.item_id == 2, "timestamp"] -= pd.Timedelta(days=25)
    return frame


@pytest.mark.parametrize("name", TABLES)
def test_a_missing_target_column_is_named_not_reported_as_unsorted_times(tmp_path, name):
    path = save(overlapping_items_numbered(), tmp_path / name)
    for options in ({}, {"format": "long"}):
        with pytest.raises(LocalDataError, match=r"no column 'target'.*data.target_column"):
            load_local(path, **options)
    collection = load_local(path, target_column="value")
    assert collection.item_ids == ["1", "2"]
    np.testing.assert_array_equal(collection.series[1], B)


@pytest.mark.parametrize("name", ["wide.csv", "wide.parquet"])
def test_format_reads_a_wide_file_and_auto_agrees(tmp_path, name):
    times = pd.date_range("2024-01-01", periods=len(B), freq="h")
    path = save(pd.DataFrame({"timestamp": times, "a": A[: len(B)], "b": B}), tmp_path / name)
    for format_ in ("auto", "wide"):
        collection = load_local(path, format=format_)
        assert collection.item_ids == ["a", "b"]
        np.testing.assert_array_equal(collection.series[1], B)
    with pytest.raises(LocalDataError, match=r"data.format must be one of.*'columns'"):
        load_local(path, format="columns")


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        # a value column of another name and a text id of another name: long, not wide
        (long_frame().rename(columns={"item_id": "store", "target": "sales"}), r"\['store'\]"),
        # numeric ids of another name: the repeated timestamps say it is not wide
        (
            overlapping_items_numbered().rename(columns={"item_id": "store"}),
            "timestamps in 'timestamp' repeat",
        ),
    ],
)
def test_auto_refuses_a_file_it_cannot_read_one_way_and_lists_the_options(tmp_path, frame, why):
    path = save(frame, tmp_path / "neither.csv")
    with pytest.raises(LocalDataError) as error:
        load_local(path)
    message = str(error.value)
    assert "cannot tell whether the file is long or wide" in message
    assert re.search(why, message) and str(list(frame.columns)) in message
    for option in ("data.format=long", "data.id_column", "data.target_column", "data.format=wide"):
        assert option in message


def test_a_typo_in_a_wide_file_is_named_not_taken_for_an_id_column(tmp_path):
    times = pd.date_range("2024-01-01", periods=len(B), freq="h")
    frame = pd.DataFrame({"timestamp": times, "a": B.astype(object)})
    frame.loc[3, "a"] = "1,5"
    with pytest.raises(LocalDataError, match=r"1 non-numeric value.*'1,5' at row 3"):
        load_local(save(frame, tmp_path / "wide.csv"))


def test_the_file_is_read_as_told_once_the_options_are_set(tmp_path):
    frame = long_frame().rename(columns={"item_id": "store", "target": "sales"})
    path = save(frame, tmp_path / "named.csv")
    check_two_series(load_local(path, id_column="store", target_column="sales"))


def mixed_frequency_frame() -> pd.DataFrame:
    hourly = pd.date_range("2024-01-01", periods=len(A), freq="h")
    daily = pd.date_range("2024-01-01", periods=30, freq="D")
    return pd.concat(
        [
            pd.DataFrame({"item_id": "hourly", "timestamp": hourly, "target": A}),
            pd.DataFrame({"item_id": "daily", "timestamp": daily, "target": B[:30]}),
        ],
        ignore_index=True,
    )


@pytest.mark.parametrize("name", TABLES)
def test_series_of_different_frequencies_are_refused_by_name(tmp_path, name):
    path = save(mixed_frequency_frame(), tmp_path / name)
    with pytest.raises(
        LocalDataError, match=r"different frequencies \(h: 'hourly'; D: 'daily'\).*own"
    ):
        load_local(path)


def test_a_daily_column_in_an_hourly_wide_file_is_refused(tmp_path):
    times = pd.date_range("2024-01-01", periods=len(A), freq="h")
    daily = np.where(times.hour == 0, A, np.nan)
    frame = pd.DataFrame({"timestamp": times, "hourly": A, "daily": daily})
    with pytest.raises(LocalDataError, match=r"h: 'hourly'; D: 'daily'"):
        load_local(save(frame, tmp_path / "wide.csv"))


def test_a_given_frequency_is_that_of_every_series(tmp_path):
    path = save(mixed_frequency_frame(), tmp_path / "mixed.csv")
    daily = load_local(path, freq="h").series[1]
    assert len(daily) == 29 * 24 + 1 and np.isfinite(daily).sum() == 30


@pytest.mark.parametrize("name", ["empty.csv", "empty.csv.gz", "empty.parquet"])
def test_an_empty_file_is_named(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wb"):
            pass
    else:
        path.write_bytes(b"")
    with pytest.raises(LocalDataError, match=re.escape(f"data.path={str(path)!r}") + " is empty"):
        load_local(str(path))


@pytest.mark.parametrize("name", ["header.csv", "header.parquet"])
def test_a_file_with_a_header_and_no_rows_is_named(tmp_path, name):
    path = save(long_frame().iloc[:0], tmp_path / name)
    match = re.escape(f"data.path={path!r} has columns ['item_id', 'timestamp', 'target']")
    with pytest.raises(LocalDataError, match=match + " but no rows"):
        load_local(path)


def test_a_column_with_no_value_is_named(tmp_path):
    times = pd.date_range("2024-01-01", periods=len(B), freq="h")
    frame = pd.DataFrame({"timestamp": times, "a": B, "unused": np.nan})
    with pytest.raises(LocalDataError, match="series 'unused' has no values"):
        load_local(save(frame, tmp_path / "wide.csv"))


def berlin_file(tmp_path, start: str, periods: int, freq: str, name: str = "berlin.csv") -> str:
    """One series of ``A`` at ``freq`` in Europe/Berlin, its timestamps written with their UTC
    offsets (``name`` ending in ``-aware.parquet``: as a time-zone-aware datetime column)."""
    times = pd.date_range(start, periods=periods, freq=freq, tz="Europe/Berlin")
    written = times if name.endswith("-aware.parquet") else times.astype(str)
    return save(pd.DataFrame({"timestamp": written, "target": A[:periods]}), tmp_path / name)


BERLIN_FILES = ["berlin.csv", "berlin.parquet", "berlin-aware.parquet"]


@pytest.mark.parametrize("name", BERLIN_FILES)
@pytest.mark.parametrize("start", ["2024-03-30 12:00", "2024-10-26 12:00"])
def test_hourly_timestamps_across_a_dst_change_are_read_in_utc(tmp_path, start, name):
    path = berlin_file(tmp_path, start, 48, "h", name)
    if name == "berlin.csv" and start.startswith("2024-03"):
        assert "2024-03-31 01:00:00+01:00," in open(path).read()
        assert "2024-03-31 03:00:00+02:00" in open(path).read()
    collection = load_local(path)
    assert collection.freq == "h"
    np.testing.assert_array_equal(collection.series[0], A[:48])  # no gap, no duplicate


@pytest.mark.parametrize("name", BERLIN_FILES)
def test_daily_timestamps_across_a_dst_change_keep_their_local_dates(tmp_path, name):
    collection = load_local(berlin_file(tmp_path, "2024-03-20", 30, "D", name))
    assert collection.freq == "D"
    np.testing.assert_array_equal(collection.series[0], A[:30])
