"""The benchmark sets fail fast offline and load from a local copy."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pandas as pd
import pytest

from isoprobe.data import TimeSeriesDataModule, dataset_spec, load_series, online
from isoprobe.data.online import BENCHMARKS, series_from_frame

# the authors' (context, horizon) per benchmark set (the rank-structure paper)
AUTHORS_WINDOWS = {
    "australian_electricity": (144, 48),
    "solar": (90, 30),
    "rainfall": (90, 30),
    "exchange_rate": (36, 12),
    "nn5_weekly": (24, 8),
    "hospital": (72, 12),
    "covid_deaths": (90, 30),
    "car_parts": (36, 12),
    "dominick": (24, 8),
    "fred_md": (36, 12),
}


def test_benchmark_sets_are_registered_online_with_the_authors_windows():
    assert set(BENCHMARKS) == set(AUTHORS_WINDOWS)
    for name, windows in AUTHORS_WINDOWS.items():
        spec = dataset_spec(name)
        assert not spec.offline
        assert (spec.context_length, spec.prediction_length) == windows
        assert dataset_spec(BENCHMARKS[name].closest_offline).offline


@pytest.mark.parametrize("flag", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_offline_load_fails_fast_with_the_fix(monkeypatch, flag):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv(flag, "1")
    dm = TimeSeriesDataModule("hospital")
    started = time.perf_counter()
    with pytest.raises(ConnectionError, match=r"data\.path=.*data\.dataset=pbs"):
        dm.setup("fit")
    assert time.perf_counter() - started < 5.0


def test_missing_datasets_package_says_how_to_install(monkeypatch):
    if importlib.util.find_spec("datasets") is not None:
        pytest.skip("datasets is installed: this would download")
    monkeypatch.setattr(online, "host_reachable", lambda: True)
    with pytest.raises(ImportError, match="pip install datasets"):
        load_series("exchange_rate")


def test_local_long_csv_feeds_the_datamodule(tmp_path):
    rows = []
    for item, offset in (("b", 1000.0), ("a", 0.0)):
        for t in range(40):
            rows.append(
                {
                    "item_id": item,
                    "timestamp": f"2020-01-{1 + t % 31:02d}" if t < 31 else f"2020-02-{t - 30:02d}",
                    "target": offset + t,
                }
            )
    frame = pd.DataFrame(rows).sample(frac=1.0, random_state=0)  # rows out of order
    path = tmp_path / "copy.csv"
    frame.to_csv(path, index=False)

    data = load_series("nn5_weekly", path=str(path))
    assert data.item_ids == ["a", "b"] and data.freq == "W"
    np.testing.assert_array_equal(data.series[0], np.arange(40.0))
    np.testing.assert_array_equal(data.series[1], 1000.0 + np.arange(40.0))

    dm = TimeSeriesDataModule("nn5_weekly", path=str(path), context_length=4, prediction_length=2)
    dm.setup("fit")
    first_test = dm.test_dataset[0]
    assert first_test["target"].tolist() == [32.0, 33.0]  # test segment of 40 starts at 32
    assert dm.season_length == 1 and dm.report["series_total"] == 2

    only_b = load_series("nn5_weekly", path=str(path), items=["b"])
    assert only_b.item_ids == ["b"] and only_b.series[0][0] == 1000.0
    with pytest.raises(ValueError, match=r"no series with id \['c'\]"):
        load_series("nn5_weekly", path=str(path), items=["c"])


def test_local_folder_and_missing_path(tmp_path):
    for part in range(2):
        pd.DataFrame({"item_id": f"p{part}", "target": np.arange(5.0) + part}).to_csv(
            tmp_path / f"part-{part}.csv", index=False
        )
    data = load_series("hospital", path=str(tmp_path))
    assert data.item_ids == ["p0", "p1"] and data.series[1].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_series("hospital", path=str(tmp_path / "nothing.parquet"))


def test_one_row_per_series_unstacks_list_columns():
    frame = pd.DataFrame(
        {
            "id": ["x", "y"],
            "timestamp": [np.arange(3), np.arange(2)],
            "target": [np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0])],
            "load": [[7.0, 8.0, 9.0], [0.0, 1.0]],
        }
    )
    series, ids = series_from_frame(frame)
    assert ids == ["x/target", "x/load", "y/target", "y/load"]
    assert [s.tolist() for s in series] == [[1, 2, 3], [7, 8, 9], [4, 5], [0, 1]]
    with pytest.raises(ValueError, match="cannot find series in columns"):
        series_from_frame(pd.DataFrame({"value": [1.0]}))


def test_parquet_copy_in_the_chronos_layout(tmp_path):
    path = tmp_path / "train.parquet"
    if importlib.util.find_spec("pyarrow") is None:
        path.write_bytes(b"PAR1")
        with pytest.raises(ImportError, match="pip install pyarrow"):
            load_series("australian_electricity", path=str(path))
        return
    frame = pd.DataFrame({"id": ["T1", "T2"], "target": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]})
    frame.to_parquet(path)
    data = load_series("australian_electricity", path=str(path))
    assert data.item_ids == ["T1", "T2"] and data.series[1].tolist() == [4.0, 5.0, 6.0]
