"""The LightningDataModule every config in ``configs/data`` builds."""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, DistributedSampler

from isoprobe.data.local import load_local
from isoprobe.data.registry import DatasetSpec, SeriesCollection, dataset_spec, load_series
from isoprobe.data.windows import (
    NAN_POLICIES,
    SCALINGS,
    SEGMENTS,
    DataReport,
    WindowDataset,
    add_relative_noise,
    check_choice,
    check_finite_after,
    clean_series,
    evenly_spaced,
    window_starts,
)

log = logging.getLogger(__name__)

SHORT_SERIES_POLICIES = ("skip", "error")
#: the keyword arguments of the ``local`` loader that ``data=local`` takes as ``data.*`` keys
LOCAL_READING_OPTIONS = tuple(inspect.signature(load_local).parameters)[1:]


class EpochSampler(DistributedSampler):
    """``num_samples`` of ``size`` indices without replacement, in an order that depends on
    (``seed``, epoch) alone, the epoch read from ``epoch()`` when iteration starts. It draws
    nothing from the global generator, so a run resumed from a checkpoint trains on the same
    windows in the same order as an uninterrupted run, and dropout draws the same masks.

    Under DDP process ``rank`` of ``processes`` takes the ``rank``-th, (``rank`` +
    ``processes``)-th, ... index of that order, so that, in batches of ``batch / processes``,
    the processes' step i together covers one process's batch i of ``batch`` indices. The last
    ``num_samples % processes`` indices of the order are left out, so that every process runs
    the same number of steps. (A DistributedSampler, so that Lightning uses it as it is rather
    than wrap it in its own, which would shuffle the order once more.)"""

    def __init__(
        self,
        size: int,
        num_samples: int,
        seed: int,
        epoch: Callable[[], int],
        rank: int = 0,
        processes: int = 1,
    ) -> None:
        super().__init__(range(size), num_replicas=processes, rank=rank, shuffle=False)
        self.size, self.count, self.seed, self.read_epoch = size, num_samples, seed, epoch

    def __iter__(self) -> Iterator[int]:
        (state,) = np.random.SeedSequence([self.seed, self.read_epoch()]).generate_state(1)
        generator = torch.Generator().manual_seed(int(state))
        order = torch.randperm(self.size, generator=generator)[: self.count]
        return iter(order[self.rank : len(self) * self.num_replicas : self.num_replicas].tolist())

    def __len__(self) -> int:
        return self.count // self.num_replicas


class TimeSeriesDataModule(L.LightningDataModule):
    """(context, target) windows of a registered data set, split by time within each series.

    ``context_length`` and ``prediction_length`` are known right after construction (the
    registry's defaults fill a None), so a model can be built from them before ``setup``.

    Args:
        dataset: a registered name (``isoprobe.data.available_datasets()``).
        context_length / prediction_length: window lengths; None = the data set's default.
        dataset_kwargs: keyword arguments of the data set's loader (e.g. KernelSynth's
            ``num_series``, an online set's ``path``).
        path: a local copy of an online benchmark set, forwarded to its loader as ``path=``.
        split: fractions of every series for train / validation / test, in time order.
        train_stride / eval_stride: steps between window starts; ``eval_stride`` None = the
            horizon (validation/test targets do not overlap).
        batch_size: training windows per optimiser step, over all DDP processes together
            (each takes ``batch_size / world_size`` of them).
        eval_batch_size: validation and test windows per batch and process (None = batch_size).
        max_train_windows: windows drawn afresh, without replacement, every epoch, in an order
            set by ``seed`` and the epoch (:class:`EpochSampler`); None = all windows, shuffled
            the same way.
        max_eval_windows: validation and test windows kept, evenly spaced, in a fixed order.
        scaling: per-window scaling from the context only: ``none`` | ``mean`` (divide by the
            mean |x|) | ``standard`` (subtract the mean, divide by the standard deviation).
            Context and target are both scaled; items carry ``loc`` and ``scale``.
        noise_std: Gaussian noise added to every series with standard deviation ``noise_std``
            x that series' standard deviation (the isotropy paper's noise experiment uses 0.05).
            Context and target both carry it.
        nan_policy: NaN/inf values: ``impute`` (linear inside, nearest at the edges) | ``drop``
            (skip the windows touching one) | ``error``.
        short_series: a series shorter than one window (context + horizon): ``skip`` it (and
            count it in the report) | ``error``.
        seed: seed of the noise and of the training windows' order.
    """

    def __init__(
        self,
        dataset: str,
        context_length: int | None = None,
        prediction_length: int | None = None,
        dataset_kwargs: dict[str, Any] | None = None,
        path: str | None = None,
        split: Sequence[float] = (0.7, 0.1, 0.2),
        train_stride: int = 1,
        eval_stride: int | None = None,
        max_train_windows: int | None = None,
        max_eval_windows: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        scaling: str = "none",
        noise_std: float = 0.0,
        nan_policy: str = "impute",
        short_series: str = "skip",
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.spec: DatasetSpec = dataset_spec(dataset)
        self.dataset = dataset
        self.context_length = _positive(
            "data.context_length", context_length, self.spec.context_length
        )
        self.prediction_length = _positive(
            "data.prediction_length", prediction_length, self.spec.prediction_length
        )
        self.dataset_kwargs = dict(dataset_kwargs or {})
        if path is not None:
            self.dataset_kwargs["path"] = str(path)
        _check_loader_kwargs(self.spec, self.dataset_kwargs)
        self.split = _check_split(split)
        self.train_stride = _positive("data.train_stride", train_stride)
        self.eval_stride = _positive("data.eval_stride", eval_stride, self.prediction_length)
        self.max_train_windows = _positive_or_none("data.max_train_windows", max_train_windows)
        self.max_eval_windows = _positive_or_none("data.max_eval_windows", max_eval_windows)
        self.batch_size = _positive("data.batch_size", batch_size)
        self.eval_batch_size = _positive("data.eval_batch_size", eval_batch_size, self.batch_size)
        self.num_workers = int(num_workers)
        check_choice("data.scaling", scaling, SCALINGS)
        check_choice("data.nan_policy", nan_policy, NAN_POLICIES)
        check_choice("data.short_series", short_series, SHORT_SERIES_POLICIES)
        if not (math.isfinite(noise_std) and noise_std >= 0):
            raise ValueError(f"data.noise_std must be a finite number >= 0, got {noise_std}")
        self.scaling = scaling
        self.noise_std = float(noise_std)
        self.nan_policy = nan_policy
        self.short_series = short_series
        self.seed = int(seed)
        self.collection: SeriesCollection | None = None
        self.train_dataset: WindowDataset | None = None
        self.val_dataset: WindowDataset | None = None
        self.test_dataset: WindowDataset | None = None
        self._report = DataReport()

    @property
    def season_length(self) -> int:
        return self._loaded().season_length

    @property
    def freq(self) -> str:
        return self._loaded().freq

    @property
    def report(self) -> dict:
        """Counts of series, non-finite values and windows (see :class:`DataReport`)."""
        return self._report.as_dict()

    def _loaded(self) -> SeriesCollection:
        if self.collection is None:
            raise RuntimeError("call setup() first: season_length and freq come with the data")
        return self.collection

    def setup(self, stage: str | None = None) -> None:
        if self.collection is not None:
            return
        collection = load_series(self.dataset, **self.dataset_kwargs)
        report = DataReport(series_total=len(collection.series))
        series = clean_series(collection.series, self.nan_policy, collection.item_ids, report)
        noisy = add_relative_noise(series, self.noise_std, self.seed)
        check_finite_after(series, noisy, f"data.noise_std={self.noise_std}", collection.item_ids)
        series = noisy
        window = self.context_length + self.prediction_length
        lengths = np.array([len(s) for s in series])
        if len(lengths) == 0:
            raise ValueError(f"data set {self.dataset!r} loaded no series")
        too_short = (lengths < window) & (lengths > 0)
        report.series_too_short = int(too_short.sum())
        if too_short.any() and self.short_series == "error":
            names = [
                collection.item_ids[i] if collection.item_ids else f"#{i}"
                for i in np.flatnonzero(too_short)[:5]
            ]
            raise ValueError(
                f"{int(too_short.sum())} series of {self.dataset!r} are shorter than one window "
                f"(context_length + prediction_length = {window}), e.g. {names} with lengths "
                f"{lengths[too_short][:5].tolist()}. Lower data.context_length / "
                "data.prediction_length, or set data.short_series=skip to leave them out."
            )
        if not (lengths >= window).any():
            raise ValueError(
                f"all {len(series)} series of {self.dataset!r} are shorter than context_length "
                f"+ prediction_length = {self.context_length} + {self.prediction_length} = "
                f"{window} (lengths {lengths.min()}..{lengths.max()}). "
                "Lower data.context_length (or data.prediction_length)."
            )
        starts = {
            segment: window_starts(
                series,
                self.context_length,
                self.prediction_length,
                segment,
                self.split,
                self.train_stride if segment == "train" else self.eval_stride,
                report,
            )
            for segment in SEGMENTS
        }
        for segment in ("val", "test"):
            starts[segment] = starts[segment][
                evenly_spaced(len(starts[segment]), self.max_eval_windows)
            ]
        self._check_not_empty(starts, lengths, training=stage in (None, "fit"))
        report.windows = {segment: len(rows) for segment, rows in starts.items()}
        self.train_dataset, self.val_dataset, self.test_dataset = (
            WindowDataset(
                series, starts[s], self.context_length, self.prediction_length, self.scaling
            )
            for s in SEGMENTS
        )
        self.collection, self._report = collection, report
        if report.worth_a_warning and rank_zero_only.rank == 0:
            log.warning("data set %s: %s", self.dataset, report.as_dict())

    def _check_not_empty(
        self, starts: dict[str, np.ndarray], lengths: np.ndarray, training: bool
    ) -> None:
        """Every segment the run reads must hold a window: a run set up for another stage than
        ``fit`` (zero-shot probing, compression) reads no training window, so a data set whose
        series are too short for one at this context is still probed and forecast."""
        needed = SEGMENTS if training else tuple(s for s in SEGMENTS if s != "train")
        empty = [
            s
            for s, f in zip(SEGMENTS, self.split, strict=True)
            if s in needed and f > 0 and len(starts[s]) == 0
        ]
        if empty:
            fixes = "lower data.context_length / data.prediction_length or widen data.split"
            if self.nan_policy != "impute":
                fixes += ", or use data.nan_policy=impute (missing values cut no windows)"
            raise ValueError(
                f"data set {self.dataset!r} gives no {'/'.join(empty)} window with context "
                f"{self.context_length} + horizon {self.prediction_length}, split "
                f"{list(self.split)} and nan_policy {self.nan_policy!r} (series lengths "
                f"{lengths.min()}..{lengths.max()}): each segment must hold a whole horizon. "
                f"To get one, {fixes}."
            )

    def train_dataloader(self) -> DataLoader:
        dataset = self._built(self.train_dataset)
        count = len(dataset)
        if self.max_train_windows is not None:
            count = min(count, self.max_train_windows)
        rank, processes = self._process()
        sampler = EpochSampler(len(dataset), count, self.seed, self._current_epoch, rank, processes)
        return DataLoader(
            dataset,
            batch_size=self._per_process_batch_size(processes),
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            # worker seeds from here, not from the global generator that dropout draws from
            generator=torch.Generator().manual_seed(self.seed),
        )

    def _process(self) -> tuple[int, int]:
        """This process's rank and the number of processes (0 and 1 outside DDP)."""
        trainer = getattr(self, "trainer", None)
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _per_process_batch_size(self, processes: int) -> int:
        """``batch_size`` is the global batch: each of the DDP processes takes ``batch_size /
        processes`` windows a step (see :class:`EpochSampler` for which)."""
        if self.batch_size % processes:
            raise ValueError(
                f"data.batch_size={self.batch_size} is the global batch, split evenly over the "
                f"{processes} DDP processes (trainer.devices x trainer.num_nodes): set "
                f"data.batch_size to a multiple of {processes}."
            )
        return self.batch_size // processes

    def _current_epoch(self) -> int:
        trainer = getattr(self, "trainer", None)
        return trainer.current_epoch if trainer is not None else 0

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader(self.val_dataset)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader(self.test_dataset)

    def _eval_loader(self, dataset: WindowDataset | None) -> DataLoader:
        return DataLoader(
            self._built(dataset),
            batch_size=self.eval_batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    @staticmethod
    def _built(dataset: WindowDataset | None) -> WindowDataset:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        return dataset


def _positive(option: str, value: int | None, default: int | None = None) -> int:
    value = default if value is None else value
    if value is None or int(value) != value or value < 1:
        raise ValueError(f"{option} must be a positive integer, got {value!r}")
    return int(value)


def _positive_or_none(option: str, value: int | None) -> int | None:
    return None if value is None else _positive(option, value)


def _check_split(split: Sequence[float]) -> tuple[float, float, float]:
    fractions = tuple(float(f) for f in split)
    finite = all(math.isfinite(f) for f in fractions)
    if len(fractions) != 3 or not finite or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(
            "data.split must be 3 fractions (train, val, test) >= 0 summing to 1, "
            f"got {list(split)}"
        )
    if fractions[0] == 0:
        raise ValueError(f"data.split gives the train segment nothing: {list(split)}")
    return fractions  # type: ignore[return-value]


def _check_loader_kwargs(spec: DatasetSpec, kwargs: dict[str, Any]) -> None:
    """Fail at construction, not at setup, on a keyword the data set's loader does not take."""
    parameters = inspect.signature(spec.loader).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unknown = sorted(set(kwargs) - set(parameters))
    if unknown:
        hint = " (data.path is for the online benchmark sets)" if "path" in unknown else ""
        raise ValueError(
            f"data set {spec.name!r} takes no {', '.join(unknown)}{hint}; its loader takes: "
            f"{', '.join(parameters) or 'nothing'}"
        )


class LocalDataModule(TimeSeriesDataModule):
    """:class:`TimeSeriesDataModule` over your own file (``data=local data.path=<file>``): the
    reading options of :func:`isoprobe.data.local.load_local` (``format``, ``id_column``,
    ``timestamp_column``, ``target_column``, ``freq``, ``season_length``) are ``data.*`` keys of
    their own, and a series shorter than one window is an error by default."""

    def __init__(
        self, path: str, dataset: str = "local", short_series: str = "error", **kwargs: Any
    ) -> None:
        if path is None:
            raise ValueError("data=local needs a file: data.path=/path/to/series.csv")
        reading = {name: kwargs.pop(name) for name in LOCAL_READING_OPTIONS if name in kwargs}
        super().__init__(
            dataset=dataset, path=path, dataset_kwargs=reading, short_series=short_series, **kwargs
        )
