"""`data=local data.path=<file>`: long and wide CSV/Parquet and GluonTS Arrow files, checked
against the values written, and a clear error for each kind of bad file."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from gluonts.dataset.arrow import ArrowWriter
from gluonts.time_feature import get_seasonality
from hydra.utils import instantiate
from omegaconf import OmegaConf

from isoprobe.data import LocalDataModule
from isoprobe.data.local import LocalDataError, load_local, season_length_of
from tests.conftest import CONFIG_DIR

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
    data = OmegaConf.merge(OmegaConf.load(CONFIG_DIR / "data" / "local.yaml"), overrides)
    root = OmegaConf.create({"seed": 0, "data": data})
    return instantiate(root.data, path=str(path))


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
