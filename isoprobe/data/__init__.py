"""Data sets (offline package data, KernelSynth, online benchmark sets) and the DataModule."""

from isoprobe.data import kernelsynth, local, offline, online  # noqa: F401  (registers the sets)
from isoprobe.data.datamodule import LocalDataModule, TimeSeriesDataModule
from isoprobe.data.registry import (
    SeriesCollection,
    UnknownDatasetError,
    available_datasets,
    dataset_spec,
    load_series,
    register_dataset,
)

__all__ = [
    "LocalDataModule",
    "SeriesCollection",
    "TimeSeriesDataModule",
    "UnknownDatasetError",
    "available_datasets",
    "dataset_spec",
    "load_series",
    "register_dataset",
]
