"""The isotropy paper's benchmark sets (Monash / Chronos benchmark), loaded from the Hugging Face
collection ``autogluon/chronos_datasets`` with the ``datasets`` package, or from a local copy.

They need the network, so they are never a default. Without it (huggingface.co:443 unreachable
within 3 s, or HF_HUB_OFFLINE / HF_DATASETS_OFFLINE set) a load fails at once with a message that
names ``data.path=`` and the closest offline set.

A local copy (``data.path=...``) is a file or a folder of files in one of two layouts:

* one row per series (the chronos_datasets layout): list-valued columns hold the series; every
  list-valued column except ``timestamp`` is one univariate series per row (as Chronos'
  evaluation unstacks multivariate sets); ``id`` or ``item_id`` names the row;
* long: one row per observation with a scalar ``target`` column, an optional ``item_id`` (or
  ``id``) column naming the series and an optional ``timestamp`` column ordering it.

Files: ``.parquet`` (needs ``pyarrow``), ``.csv`` / ``.csv.gz``, ``.arrow`` (needs ``datasets``);
folders: all parquet (else CSV) files below them, in name order, or a ``save_to_disk`` folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from isoprobe.data.registry import SeriesCollection, register_dataset
from isoprobe.network import host_reachable

COLLECTION = "autogluon/chronos_datasets"
LICENSE = "per data set; the Monash repository's sets are CC BY 4.0 (see the dataset card)"
ID_COLUMNS = ("item_id", "id")


@dataclass(frozen=True)
class Benchmark:
    """One set of the isotropy paper: its collection config and the authors' windows."""

    config: str
    freq: str
    season_length: int
    context_length: int
    prediction_length: int
    domain: str
    closest_offline: str


BENCHMARKS = {
    "australian_electricity": Benchmark(
        "monash_australian_electricity", "30min", 48, 144, 48, "energy", "vic_elec"
    ),
    "solar": Benchmark("solar_1h", "h", 24, 90, 30, "weather", "sea_surface_temperature"),
    "rainfall": Benchmark("monash_weather", "D", 1, 90, 30, "weather", "seattle_weather"),
    "exchange_rate": Benchmark("exchange_rate", "B", 5, 36, 12, "finance", "stocks"),
    "nn5_weekly": Benchmark("monash_nn5_weekly", "W", 1, 24, 8, "finance", "gafa_stock"),
    "hospital": Benchmark("monash_hospital", "MS", 12, 72, 12, "healthcare", "pbs"),
    "covid_deaths": Benchmark("monash_covid_deaths", "D", 1, 90, 30, "healthcare", "pbs"),
    "car_parts": Benchmark("monash_car_parts", "MS", 12, 36, 12, "retail", "aus_retail"),
    "dominick": Benchmark("dominick", "W", 1, 24, 8, "retail", "aus_retail"),
    "fred_md": Benchmark("monash_fred_md", "MS", 12, 36, 12, "finance", "us_retail_employment"),
}


def series_from_frame(frame: pd.DataFrame) -> tuple[list[np.ndarray], list[str]]:
    """Univariate series and their ids from a table in either layout (module docstring)."""
    id_column = next((c for c in ID_COLUMNS if c in frame.columns), None)
    list_columns = [c for c in frame.columns if c != "timestamp" and _holds_lists(frame[c])]
    if list_columns:
        names = frame[id_column].astype(str) if id_column else pd.Series(range(len(frame)))
        series, ids = [], []
        for row, name in zip(frame.itertuples(index=False), names, strict=True):
            for column in list_columns:
                series.append(np.asarray(getattr(row, column), dtype=np.float64))
                ids.append(str(name) if len(list_columns) == 1 else f"{name}/{column}")
        return series, ids
    if "target" in frame.columns:
        if id_column is None:
            frame = frame.assign(item_id="0")
            id_column = "item_id"
        if "timestamp" in frame.columns:
            frame = frame.assign(timestamp=pd.to_datetime(frame["timestamp"]))
            frame = frame.sort_values([id_column, "timestamp"], kind="stable")
        groups = frame.groupby(id_column, sort=True)["target"]
        return [g.to_numpy(dtype=np.float64) for _, g in groups], [str(k) for k, _ in groups]
    raise ValueError(
        f"cannot find series in columns {list(frame.columns)}: expected list-valued columns "
        "(one row per series, e.g. 'target') or a long table with a scalar 'target' column "
        "(and optional 'item_id', 'timestamp')"
    )


def _holds_lists(column: pd.Series) -> bool:
    first = column.dropna()
    return len(first) > 0 and isinstance(first.iloc[0], list | tuple | np.ndarray)


def read_local_copy(path: str | Path) -> pd.DataFrame:
    """The table stored at ``path`` (a file or a folder, see the module docstring)."""
    location = Path(path).expanduser()
    if location.is_file():
        return _read_file(location)
    if not location.is_dir():
        raise FileNotFoundError(f"data.path={str(path)!r} does not exist")
    if (location / "dataset_dict.json").is_file() or (location / "state.json").is_file():
        return _load_from_disk(location)
    files = sorted(location.rglob("*.parquet")) or sorted(
        [*location.rglob("*.csv"), *location.rglob("*.csv.gz")]
    )
    if not files:
        raise FileNotFoundError(f"data.path={str(path)!r} holds no .parquet or .csv file")
    return pd.concat([_read_file(f) for f in files], ignore_index=True)


def _read_file(file: Path) -> pd.DataFrame:
    name = file.name.lower()
    if name.endswith(".parquet"):
        try:
            return pd.read_parquet(file)
        except ImportError as err:
            raise ImportError(f"reading {file} needs pyarrow: pip install pyarrow") from err
    if name.endswith((".csv", ".csv.gz")):
        return pd.read_csv(file)
    if name.endswith(".arrow"):
        return _datasets_module().Dataset.from_file(str(file)).to_pandas()
    raise ValueError(f"data.path file {file} is not .parquet, .csv(.gz) or .arrow")


def _load_from_disk(folder: Path) -> pd.DataFrame:
    datasets = _datasets_module()
    stored = datasets.load_from_disk(str(folder))
    if isinstance(stored, datasets.DatasetDict):
        stored = stored["train"] if "train" in stored else next(iter(stored.values()))
    return stored.to_pandas()


def _datasets_module():
    try:
        import datasets
    except ImportError as err:
        raise ImportError(
            "loading the isotropy paper's benchmark sets needs the Hugging Face datasets "
            "package: pip install datasets"
        ) from err
    return datasets


def download(config: str) -> pd.DataFrame:
    """The ``train`` split of ``config`` in the chronos_datasets collection, as a table."""
    return _datasets_module().load_dataset(COLLECTION, config, split="train").to_pandas()


def load_benchmark(
    name: str, path: str | None = None, items: Sequence[str] | None = None
) -> SeriesCollection:
    """Benchmark set ``name`` from ``path`` if given, else from the hub; ``items`` keeps only
    the series with these ids (e.g. two states of australian_electricity)."""
    bench = BENCHMARKS[name]
    if path is not None:
        frame, source = read_local_copy(path), f"local copy {path} of {COLLECTION}:{bench.config}"
    elif not host_reachable():
        raise ConnectionError(
            f"data set {name!r} is downloaded from Hugging Face ({COLLECTION}, config "
            f"{bench.config!r}), which cannot be reached (no network, or HF_HUB_OFFLINE / "
            f"HF_DATASETS_OFFLINE is set). Give a local copy with data.path=/path/to/"
            f"{bench.config}.parquet, or use the closest offline set: "
            f"data.dataset={bench.closest_offline}."
        )
    else:
        frame, source = download(bench.config), f"Hugging Face {COLLECTION}:{bench.config}"
    series, ids = series_from_frame(frame)
    if items is not None:
        wanted = [str(i) for i in items]
        missing = sorted(set(wanted) - set(ids))
        if missing:
            raise ValueError(f"{name}: no series with id {missing}; ids are e.g. {ids[:10]}")
        keep = [ids.index(i) for i in wanted]
        series, ids = [series[k] for k in keep], wanted
    return SeriesCollection(name, series, bench.freq, bench.season_length, source, LICENSE, ids)


def _register(name: str, bench: Benchmark) -> None:
    def load(path: str | None = None, items: Sequence[str] | None = None) -> SeriesCollection:
        return load_benchmark(name, path=path, items=items)

    load.__name__ = f"load_{name}"
    load.__doc__ = f"The {name} benchmark set ({COLLECTION}:{bench.config}); see load_benchmark."
    register_dataset(
        name,
        context_length=bench.context_length,
        prediction_length=bench.prediction_length,
        offline=False,
        domain=bench.domain,
    )(load)


for _name, _bench in BENCHMARKS.items():
    _register(_name, _bench)
