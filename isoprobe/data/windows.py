"""Cleaning series and cutting them into (context, target) windows split by time.

Each series is split in time order into a train, a validation and a test segment. A window
belongs to the segment that holds its whole target; its context may reach back into earlier
segments (but never before the series' start).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset

NAN_POLICIES = ("impute", "drop", "error")
SCALINGS = ("none", "mean", "standard")
SEGMENTS = ("train", "val", "test")


@dataclass
class DataReport:
    """What cleaning and windowing did to a data set, for the run's log and summary."""

    series_total: int = 0
    series_too_short: int = 0
    series_all_nonfinite: int = 0
    nonfinite_values: int = 0
    imputed_values: int = 0
    windows_dropped_nonfinite: int = 0
    windows: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def worth_a_warning(self) -> bool:
        return bool(
            self.series_too_short
            or self.series_all_nonfinite
            or self.nonfinite_values
            or self.windows_dropped_nonfinite
        )


def check_choice(option: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {option}={value!r}; choose one of {', '.join(choices)}")


def interpolate_nonfinite(values: np.ndarray) -> np.ndarray:
    """Linear interpolation over non-finite values inside the series and the nearest finite
    value before the first / after the last finite one. Needs one finite value at least."""
    bad = ~np.isfinite(values)
    if not bad.any():
        return values
    index = np.arange(len(values))
    filled = values.copy()
    filled[bad] = np.interp(index[bad], index[~bad], values[~bad])
    return filled


def clean_series(
    series: Sequence[np.ndarray], policy: str, names: Sequence[str], report: DataReport
) -> list[np.ndarray]:
    """Count non-finite values and apply ``policy``: ``impute`` interpolates them, ``drop``
    keeps them as NaN (windows touching one are skipped later), ``error`` raises. A series with
    no finite value at all becomes empty (so it gives no window) and is counted."""
    check_choice("data.nan_policy", policy, NAN_POLICIES)
    cleaned = []
    for i, raw in enumerate(series):
        values = np.asarray(raw, dtype=np.float64)
        bad = ~np.isfinite(values)
        count = int(bad.sum())
        report.nonfinite_values += count
        if count and policy == "error":
            name = names[i] if i < len(names) else f"#{i}"
            raise ValueError(
                f"series {name!r} (index {i}) holds {count} NaN/inf values of {len(values)}; "
                "set data.nan_policy=impute (interpolate them) or data.nan_policy=drop "
                "(skip the windows that touch them)"
            )
        if count == len(values) and count:
            report.series_all_nonfinite += 1
            values = values[:0]
        elif count and policy == "impute":
            values = interpolate_nonfinite(values)
            report.imputed_values += count
        elif count:
            values = np.where(bad, np.nan, values)
        cleaned.append(values)
    return cleaned


def add_relative_noise(
    series: Sequence[np.ndarray], noise_std: float, seed: int
) -> list[np.ndarray]:
    """Each series plus Gaussian noise of standard deviation ``noise_std`` x that series' own
    (NaN-ignoring) standard deviation; one generator seeded by ``seed`` draws all of it."""
    if noise_std < 0:
        raise ValueError(f"data.noise_std must be >= 0, got {noise_std}")
    if noise_std == 0:
        return list(series)
    rng = np.random.default_rng(seed)
    noisy = []
    for values in series:
        sigma = float(np.nanstd(values)) if len(values) else 0.0
        noisy.append(values + rng.normal(0.0, noise_std * sigma, size=len(values)))
    return noisy


def check_finite_after(
    before: Sequence[np.ndarray], after: Sequence[np.ndarray], step: str, names: Sequence[str]
) -> None:
    """Refuse what ``step`` (a transform of the cleaned series) made non-finite, and values the
    float32 windows cannot hold: the count of non-finite values is taken after every transform,
    not only on the raw data."""
    float32_max = float(np.finfo(np.float32).max)
    for i, (old, new) in enumerate(zip(before, after, strict=True)):
        name = names[i] if i < len(names) else f"#{i}"
        made = int((np.isfinite(old) & ~np.isfinite(new)).sum())
        if made:
            raise ValueError(
                f"{step} made {made} values of series {name!r} NaN/inf; choose a finite setting"
            )
        finite = new[np.isfinite(new)]
        if len(finite) and float(np.abs(finite).max()) > float32_max:
            raise ValueError(
                f"series {name!r} holds values beyond float32's range (|x| up to "
                f"{float(np.abs(finite).max()):.3g} after {step}); the windows are float32. "
                "Rescale the data."
            )


def split_bounds(length: int, split: Sequence[float]) -> tuple[int, int]:
    """(end of the train segment, end of the validation segment) of a series of ``length``."""
    train, val, _ = split
    # the epsilon keeps e.g. 10 * (0.7 + 0.1) = 7.999... at 8
    return math.floor(length * train + 1e-9), math.floor(length * (train + val) + 1e-9)


def window_starts(
    series: Sequence[np.ndarray],
    context_length: int,
    prediction_length: int,
    segment: str,
    split: Sequence[float],
    stride: int,
    report: DataReport | None = None,
) -> np.ndarray:
    """[M, 2] int64 rows (series index, target start) of every window whose target lies in
    ``segment`` of its series, whose context starts at or after the series' start, and which
    touches no NaN; starts advance by ``stride`` from the segment's first possible one."""
    check_choice("segment", segment, SEGMENTS)
    rows = [np.zeros((0, 2), dtype=np.int64)]
    for i, values in enumerate(series):
        train_end, val_end = split_bounds(len(values), split)
        lo, hi = {"train": (0, train_end), "val": (train_end, val_end), "test": (val_end, None)}[
            segment
        ]
        hi = len(values) if hi is None else hi
        starts = np.arange(max(lo, context_length), hi - prediction_length + 1, stride)
        nan = np.isnan(values)
        if len(starts) and nan.any():
            finite_before = np.concatenate([[0], np.cumsum(~nan)])
            finite = (
                finite_before[starts + prediction_length] - finite_before[starts - context_length]
            )
            clean = finite == context_length + prediction_length
            if report is not None:
                report.windows_dropped_nonfinite += int((~clean).sum())
            starts = starts[clean]
        rows.append(np.stack([np.full(len(starts), i), starts], axis=1).astype(np.int64))
    return np.concatenate(rows)


def evenly_spaced(count: int, limit: int | None) -> np.ndarray:
    """At most ``limit`` indices of ``range(count)``, spread evenly, in order."""
    if limit is None or count <= limit:
        return np.arange(count)
    return np.unique(np.linspace(0, count - 1, limit).round().astype(np.int64))


def window_scale(context: np.ndarray, scaling: str) -> tuple[float, float]:
    """(loc, scale) of one window from its context: ``none`` (0, 1); ``mean`` (0, mean |x|);
    ``standard`` (mean, standard deviation). A zero scale (flat context) becomes 1."""
    check_choice("data.scaling", scaling, SCALINGS)
    if scaling == "none":
        return 0.0, 1.0
    if scaling == "mean":
        loc, scale = 0.0, float(np.mean(np.abs(context)))
    else:
        loc, scale = float(np.mean(context)), float(np.std(context))
    return loc, scale if scale > 0 else 1.0


class WindowDataset(Dataset):
    """Windows of fixed series: item ``i`` is a dict of tensors

    ``context`` float32 [C], ``target`` float32 [H] (both ``(x - loc) / scale``), ``loc`` and
    ``scale`` float32 [] (so ``target * scale + loc`` is the series again), ``series_index``
    and ``window_index`` (= i) int64 [].
    """

    def __init__(
        self,
        series: Sequence[np.ndarray],
        starts: np.ndarray,
        context_length: int,
        prediction_length: int,
        scaling: str = "none",
    ) -> None:
        check_choice("data.scaling", scaling, SCALINGS)
        self.series = list(series)
        self.starts = np.asarray(starts, dtype=np.int64).reshape(-1, 2)
        self.context_length = context_length
        self.prediction_length = prediction_length
        self.scaling = scaling

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        series_index, start = (int(v) for v in self.starts[index])
        values = self.series[series_index]
        context = values[start - self.context_length : start]
        target = values[start : start + self.prediction_length]
        loc, scale = window_scale(context, self.scaling)
        return {
            "context": torch.as_tensor((context - loc) / scale, dtype=torch.float32),
            "target": torch.as_tensor((target - loc) / scale, dtype=torch.float32),
            "loc": torch.tensor(loc, dtype=torch.float32),
            "scale": torch.tensor(scale, dtype=torch.float32),
            "series_index": torch.tensor(series_index, dtype=torch.int64),
            "window_index": torch.tensor(int(index), dtype=torch.int64),
        }
