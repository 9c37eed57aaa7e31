"""Model against model: debiased linear CKA between every layer of one run and every layer of
another, on the probe windows both saw.

The unit two models share is the probe window (the history before one forecast origin of one
series), whatever their tokens are: each run's probe saved, per layer, every probe window's mean
real token (:mod:`isoprobe.probing.window_means`), at epoch 0 and at its last probe. Two runs
on the same data set (and the same ``data.noise_std``, which changes the series) are compared on
the windows whose (series, forecast origin) both saved, matched row for row; a window without
a real token at a layer (a row of NaN) is left out of that layer's pairs.

CKA is debiased (Song et al.'s unbiased HSIC, :func:`isoprobe.metrics.similarity.cka_of_sides`):
a few dozen windows against layers hundreds wide bias the plain estimator towards 1.

What has no value is NaN with the reason in ``note``, never a number: a pair of runs with
fewer than ``min_windows`` shared windows (one row for the pair), a run whose file is missing or
cannot be read, or that saved no window means while other runs of the study did (one row, the
reason), a layer without spread over the shared windows. A value computed without some shared
windows (their mean holds NaN or inf at that layer) says in ``note`` how many, of which run.

Noise floor: debiased CKA of unrelated windows scatters around 0, and the highest of a row of
such values can look like a match. Each pair of runs at each epoch kind gets ``noise_floor``, the
highest CKA of any of its layer pairs with one side's windows shuffled (:data:`SHUFFLES` seeded
shuffles; the highest, since a closest layer is itself the highest of a row); a model pair's
closest layer is named only above the mean floor of its run pairs (:func:`best_match`).

Per pair of models, one matrix per epoch kind: the mean over the run pairs of the two models
that share a data set and a seed (the matched seeds), or over all their run pairs where no seed
is shared (:func:`model_pair_matrices`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from isoprobe.analysis.study import AnalysisError, Study
from isoprobe.metrics.similarity import CkaSide, cka_of_sides
from isoprobe.probing.window_means import (
    DIRECTORY,
    FILES,
    WindowMeans,
    WindowMeansError,
    read_window_means,
)

#: the fewest shared windows a pair of runs is compared on
MIN_WINDOWS = 8
#: shuffles of one side's windows per pair of runs and epoch kind, for the noise floor
SHUFFLES = 5
EPOCH_KINDS = tuple(FILES)
COLUMNS = (
    "run_a",
    "run_b",
    "model_a",
    "model_b",
    "dataset",
    "epoch_kind",
    "epoch_a",
    "epoch_b",
    "layer_a",
    "layer_b",
    "n_windows",
    "cka",
    "noise_floor",
    "note",
)


@dataclass
class SavedRun:
    """A run that saved window means: its factors and, per epoch kind, the file read (or the
    reason it could not be)."""

    name: str
    model: str
    dataset: str
    data_key: tuple[str, str]
    seed: Any
    saved: dict[str, WindowMeans | str] = field(default_factory=dict)


def saved_runs(study: Study) -> list[SavedRun]:
    """The runs of ``study``, in study order, each with its saved window means or the reason it
    has none; empty when no run saved any (a study without the window-means probe)."""
    runs = study.runs.set_index("run")
    directories = {name: study.paths.get(name) for name in study.runs["run"]}
    if not any(d is not None and (d / DIRECTORY).is_dir() for d in directories.values()):
        return []
    found = []
    for name, directory in directories.items():
        row = runs.loc[name]
        noise = row.get("noise")
        found.append(
            SavedRun(
                name=str(name),
                model=str(row["model"]),
                dataset=str(row["dataset"]),
                data_key=(str(row["dataset"]), str(noise)),
                seed=row.get("seed"),
                saved={kind: _saved(directory, kind) for kind in EPOCH_KINDS},
            )
        )
    return found


def _saved(directory: Path | None, kind: str) -> WindowMeans | str:
    if directory is None or not (directory / DIRECTORY).is_dir():
        where = directory / DIRECTORY if directory is not None else "its directory"
        return f"the run saved no window means ({where} is missing)"
    return _read(directory / DIRECTORY / FILES[kind])


def _read(path: Path) -> WindowMeans | str:
    if not path.is_file():
        return f"{path} is missing"
    try:
        return read_window_means(path)
    except WindowMeansError as err:
        return str(err)


def shared_windows(a: torch.Tensor, b: torch.Tensor) -> tuple[list[int], list[int]]:
    """Row indices into ``a`` and ``b`` ([N, 2] window identities) of the windows both hold,
    in ``a``'s order."""
    where_b = {tuple(row): i for i, row in enumerate(b.tolist())}
    pairs = [(i, where_b[tuple(row)]) for i, row in enumerate(a.tolist()) if tuple(row) in where_b]
    return [i for i, _ in pairs], [j for _, j in pairs]


def model_similarity(study: Study, min_windows: int = MIN_WINDOWS) -> pd.DataFrame:
    """One row per pair of runs on the same data, epoch kind, layer of the first and layer of
    the second (:data:`COLUMNS`; module docstring). Empty when no run saved window means."""
    if min_windows < 4:
        raise AnalysisError(
            f"analyze.min_shared_windows={min_windows}: debiased CKA needs at least 4 windows "
            f"(the default, {MIN_WINDOWS}, keeps its estimate from swinging on a few)"
        )
    runs = saved_runs(study)
    rows: list[dict[str, Any]] = []
    with _one_thread():
        for i, a in enumerate(runs):
            for b in runs[i + 1 :]:
                if a.data_key == b.data_key:
                    for kind in EPOCH_KINDS:
                        rows += pair_rows(a, b, kind, min_windows)
    return pd.DataFrame(rows, columns=list(COLUMNS))


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One torch thread: the products here are a few dozen windows square, too small to
    split, and threads that wait on busy cores make each one hundreds of times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def pair_rows(a: SavedRun, b: SavedRun, kind: str, min_windows: int) -> list[dict[str, Any]]:
    """The rows of one pair of runs at one epoch kind (module docstring)."""
    base = {
        "run_a": a.name,
        "run_b": b.name,
        "model_a": a.model,
        "model_b": b.model,
        "dataset": a.dataset,
        "epoch_kind": kind,
    }
    first, second = a.saved[kind], b.saved[kind]
    for side in (first, second):
        if isinstance(side, str):
            return [{**base, "cka": math.nan, "note": f"not compared: {side}"}]
    base.update(epoch_a=first.epoch, epoch_b=second.epoch)
    rows_a, rows_b = shared_windows(first.identity, second.identity)
    if len(rows_a) < min_windows:
        why = f"{len(rows_a)} shared windows (series, forecast origin), fewer than {min_windows}"
        return [{**base, "n_windows": len(rows_a), "cka": math.nan, "note": why}]
    sides_b = {layer: _Layer(X[rows_b], b.name) for layer, X in second.layers.items()}
    rows, shuffled = [], []
    for layer_a, X in first.layers.items():
        side_a = _Layer(X[rows_a], a.name)
        for layer_b, side_b in sides_b.items():
            rows.append({**base, "layer_a": layer_a, "layer_b": layer_b})
            rows[-1].update(_cka(side_a, side_b, min_windows))
            if not math.isnan(rows[-1]["cka"]):
                shuffled += _shuffled_cka(side_a, side_b)
    floor = max(shuffled, default=math.nan)
    return [{**row, "noise_floor": floor} for row in rows]


class _Layer:
    """One layer's window means on the shared windows, prepared for CKA once for every layer
    it meets when all of them have a real token; ``run``: whose they are."""

    def __init__(self, X: torch.Tensor, run: str) -> None:
        self.X = X.double()
        self.run = run
        self.finite = torch.isfinite(self.X).all(dim=1)
        self._side: CkaSide | None = None

    def side(self, rows: torch.Tensor) -> CkaSide:
        if bool(rows.all()):
            if self._side is None:
                self._side = CkaSide.of(self.X)
            return self._side
        return CkaSide.of(self.X[rows])


def _cka(a: _Layer, b: _Layer, min_windows: int) -> dict[str, Any]:
    rows = a.finite & b.finite
    n = int(rows.sum())
    if n < min_windows:
        why = f"{n} shared windows with a real token at both layers, fewer than {min_windows}"
        return {"n_windows": n, "cka": math.nan, "note": why}
    value = cka_of_sides(a.side(rows), b.side(rows), debiased=True)
    if math.isnan(value):
        why = "a layer without spread over the shared windows (all means equal) has no CKA"
        return {"n_windows": n, "cka": math.nan, "note": why}
    return {"n_windows": n, "cka": value, "note": _dropped(a, b)}


def _dropped(a: _Layer, b: _Layer) -> str:
    """The note of a value computed without the windows whose mean holds NaN or inf."""
    counts = [(int((~side.finite).sum()), side.run) for side in (a, b)]
    which = [f"{count} in run {run}" for count, run in counts if count]
    if not which:
        return ""
    left_out = int((~(a.finite & b.finite)).sum())
    return (
        f"{left_out} of {len(a.finite)} shared windows left out: their mean holds NaN or inf "
        f"({', '.join(which)})"
    )


def _shuffled_cka(a: _Layer, b: _Layer) -> list[float]:
    """The CKA of ``a`` against ``b`` with ``b``'s windows shuffled, once per shuffle
    (:data:`SHUFFLES`, seeded: the same for every pair), on the windows both hold a finite
    mean for."""
    rows = a.finite & b.finite
    side_a, side_b = a.side(rows), b.side(rows)
    generator = torch.Generator().manual_seed(0)
    return [
        cka_of_sides(
            side_a,
            CkaSide(side_b.centred[torch.randperm(side_b.n, generator=generator)]),
            debiased=True,
        )
        for _ in range(SHUFFLES)
    ]


@dataclass
class ModelPair:
    """The layer-against-layer CKA of two models: per epoch kind, a matrix (rows: layers of
    ``model_a``, columns: layers of ``model_b``, in probe order), the mean over ``run_pairs``
    run pairs (``matched``: those sharing a seed), and its noise floor (the mean of theirs;
    NaN where none was found). ``zero_shot``: every run pair's last probe was at epoch 0,
    so both epoch kinds are the same probe."""

    model_a: str
    model_b: str
    matrices: dict[str, pd.DataFrame]
    run_pairs: int
    matched: bool
    floors: dict[str, float] = field(default_factory=dict)
    zero_shot: bool = False

    def distinct_kinds(self) -> list[str]:
        """The epoch kinds with a matrix, ``epoch0`` alone for a zero-shot pair."""
        kinds = [kind for kind in EPOCH_KINDS if kind in self.matrices]
        return kinds[:1] if self.zero_shot else kinds


def model_pair_matrices(table: pd.DataFrame, runs: pd.DataFrame) -> list[ModelPair]:
    """Per pair of distinct models (in name order), the mean CKA matrix of each epoch kind over
    their run pairs on a shared data set with the same seed, or over all their run pairs
    where none shares a seed. Pairs of runs of one model (seed against seed) stay in the
    table only."""
    found = table[table["cka"].notna() & (table["model_a"] != table["model_b"])]
    if found.empty:
        return []
    seeds = runs.set_index("run")["seed"].astype(str)
    found = _oriented(found)
    found = found.assign(matched=found["run_a"].map(seeds) == found["run_b"].map(seeds))
    pairs = []
    for (model_a, model_b), part in found.groupby(["model_a", "model_b"], sort=True):
        matched = bool(part["matched"].any())
        if matched:
            part = part[part["matched"]]
        matrices, floors = {}, {}
        for kind in EPOCH_KINDS:
            rows = part[part["epoch_kind"] == kind]
            if len(rows):
                floors[kind] = float(rows.drop_duplicates(["run_a", "run_b"])["noise_floor"].mean())
                matrix = rows.pivot_table(
                    index="layer_a", columns="layer_b", values="cka", aggfunc="mean"
                )
                matrices[kind] = matrix.loc[
                    list(dict.fromkeys(rows["layer_a"])), list(dict.fromkeys(rows["layer_b"]))
                ]
        count = part[["run_a", "run_b"]].drop_duplicates().shape[0]
        last = part[part["epoch_kind"] == "last"]
        zero_shot = len(last) > 0 and bool((last[["epoch_a", "epoch_b"]] == 0).all().all())
        pairs.append(
            ModelPair(str(model_a), str(model_b), matrices, count, matched, floors, zero_shot)
        )
    return pairs


def _oriented(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with each pair's models in name order (run, model and layer columns swapped
    where the first model's name sorts after the second's)."""
    swap = rows["model_a"].astype(str) > rows["model_b"].astype(str)
    rows = rows.copy()
    for left, right in (("run_a", "run_b"), ("model_a", "model_b"), ("layer_a", "layer_b")):
        values = rows.loc[swap, [left, right]].to_numpy()
        rows.loc[swap, [left, right]] = np.flip(values, axis=1)
    return rows


def best_match(pair: ModelPair, kind: str) -> tuple[str, str, float] | None:
    """(last layer of model A, the layer of model B most similar to it, their CKA) at
    ``kind``; None without a defined value there, or where the highest is not above the
    pair's noise floor (then it names noise, not a match)."""
    matrix = pair.matrices.get(kind)
    if matrix is None or matrix.empty:
        return None
    last = matrix.iloc[-1].dropna()
    floor = pair.floors.get(kind, math.nan)
    if last.empty or not last.max() > floor:
        return None
    return str(matrix.index[-1]), str(last.idxmax()), float(last.max())
