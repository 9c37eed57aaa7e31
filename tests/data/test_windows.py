"""Windowing, splitting, cleaning, scaling and noise on constructed series."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from isoprobe.data.windows import (
    DataReport,
    WindowDataset,
    add_relative_noise,
    clean_series,
    evenly_spaced,
    split_bounds,
    window_scale,
    window_starts,
)

SPLIT = (0.5, 0.25, 0.25)


def starts_of(series, segment, stride, context=3, horizon=2, split=SPLIT, report=None):
    rows = window_starts(series, context, horizon, segment, split, stride, report)
    return [tuple(int(v) for v in row) for row in rows]


def test_split_bounds_are_floors_of_the_fractions():
    assert split_bounds(20, SPLIT) == (10, 15)
    assert split_bounds(10, SPLIT) == (5, 7)
    # 10 * (0.7 + 0.1) is 7.999... in floating point: still 8
    assert split_bounds(10, (0.7, 0.1, 0.2)) == (7, 8)


def test_window_starts_by_segment_on_two_series():
    series = [np.arange(20.0), np.arange(10.0)]
    # series 0: train targets in [0, 10), val in [10, 15), test in [15, 20); context 3, horizon 2
    # series 1: train [0, 5), val [5, 7), test [7, 10)
    assert starts_of(series, "train", 1) == [(0, s) for s in range(3, 9)] + [(1, 3)]
    assert starts_of(series, "val", 2) == [(0, 10), (0, 12), (1, 5)]
    assert starts_of(series, "test", 2) == [(0, 15), (0, 17), (1, 7)]
    assert starts_of(series, "train", 4) == [(0, 3), (0, 7), (1, 3)]


@pytest.mark.parametrize("length", [5, 9, 23, 57, 100])
@pytest.mark.parametrize("split", [(0.7, 0.1, 0.2), (0.6, 0.15, 0.25), (0.34, 0.33, 0.33)])
def test_targets_lie_in_their_segment_and_contexts_in_the_series(length, split):
    context, horizon = 4, 3
    train_end, val_end = split_bounds(length, split)
    segments = {"train": (0, train_end), "val": (train_end, val_end), "test": (val_end, length)}
    for segment, (lo, hi) in segments.items():
        starts = [s for _, s in starts_of([np.zeros(length)], segment, 1, context, horizon, split)]
        expected = list(range(max(lo, context), hi - horizon + 1))
        assert starts == expected


def test_window_items_hold_the_exact_values():
    series = [np.arange(20.0) * 10, np.arange(10.0) - 100]
    starts = window_starts(series, 3, 2, "val", SPLIT, 2)
    dataset = WindowDataset(series, starts, 3, 2)
    assert len(dataset) == 3
    item = dataset[2]
    assert torch.equal(item["context"], torch.tensor([-98.0, -97.0, -96.0]))
    assert torch.equal(item["target"], torch.tensor([-95.0, -94.0]))
    assert item["series_index"].item() == 1 and item["window_index"].item() == 2
    assert item["context"].dtype == torch.float32 and item["series_index"].dtype == torch.int64
    assert item["loc"].shape == () and item["scale"].shape == ()


@pytest.mark.parametrize("scaling", ["mean", "standard"])
def test_scaling_uses_the_context_only_and_inverts(scaling):
    rng = np.random.default_rng(0)
    series = [rng.normal(50.0, 7.0, 40), rng.normal(-3.0, 0.5, 40)]
    starts = window_starts(series, 8, 4, "train", (0.8, 0.1, 0.1), 1)
    dataset = WindowDataset(series, starts, 8, 4, scaling)
    for index in (0, 7, len(dataset) - 1):
        item = dataset[index]
        series_index, start = starts[index]
        context = series[series_index][start - 8 : start]
        target = series[series_index][start : start + 4]
        loc, scale = (
            (0.0, np.abs(context).mean()) if scaling == "mean" else (context.mean(), context.std())
        )
        assert item["loc"].item() == pytest.approx(loc, rel=1e-6, abs=1e-6)
        assert item["scale"].item() == pytest.approx(scale, rel=1e-6)
        restored = item["target"].double() * item["scale"].double() + item["loc"].double()
        np.testing.assert_allclose(restored.numpy(), target, rtol=1e-5)
        restored = item["context"].double() * item["scale"].double() + item["loc"].double()
        np.testing.assert_allclose(restored.numpy(), context, rtol=1e-5)


def test_flat_context_scales_by_one():
    assert window_scale(np.zeros(5), "mean") == (0.0, 1.0)
    assert window_scale(np.full(5, 3.0), "standard") == (3.0, 1.0)
    assert window_scale(np.full(5, 3.0), "none") == (0.0, 1.0)


def test_impute_interpolates_inside_and_copies_the_nearest_value_at_the_edges():
    report = DataReport()
    series = [np.array([np.nan, 1.0, np.nan, np.nan, 4.0, np.inf, 6.0, np.nan]), np.ones(3)]
    cleaned = clean_series(series, "impute", ["a", "b"], report)
    np.testing.assert_array_equal(cleaned[0], [1.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0])
    np.testing.assert_array_equal(cleaned[1], np.ones(3))
    assert (report.nonfinite_values, report.imputed_values) == (5, 5)


def test_drop_keeps_nan_and_skips_the_windows_touching_it():
    series = np.arange(20.0)
    series[9] = -np.inf
    report = DataReport()
    (cleaned,) = clean_series([series], "drop", ["a"], report)
    assert np.isnan(cleaned[9]) and report.imputed_values == 0 and report.nonfinite_values == 1
    # windows [s - 3, s + 2) holding index 9: train s = 8, val s = 10 and 12
    assert starts_of([cleaned], "train", 1, report=report) == [(0, s) for s in range(3, 8)]
    assert starts_of([cleaned], "val", 2, report=report) == []
    assert starts_of([cleaned], "test", 2, report=report) == [(0, 15), (0, 17)]
    assert report.windows_dropped_nonfinite == 3


def test_error_policy_names_the_series_and_the_count():
    series = [np.ones(4), np.array([1.0, np.nan, np.inf, 2.0])]
    with pytest.raises(ValueError, match=r"'second'.*2 NaN/inf values of 4.*nan_policy=impute"):
        clean_series(series, "error", ["first", "second"], DataReport())


def test_a_series_with_no_finite_value_is_emptied_and_counted():
    report = DataReport()
    cleaned = clean_series([np.full(4, np.nan), np.ones(4)], "impute", ["a", "b"], report)
    assert len(cleaned[0]) == 0 and report.series_all_nonfinite == 1
    assert report.nonfinite_values == 4 and report.imputed_values == 0


def test_unknown_policy_and_scaling_are_refused():
    with pytest.raises(ValueError, match="data.nan_policy='zero'; choose one of impute, drop"):
        clean_series([np.ones(3)], "zero", ["a"], DataReport())
    with pytest.raises(ValueError, match="data.scaling='max'"):
        WindowDataset([np.ones(3)], np.zeros((0, 2)), 1, 1, "max")


def test_noise_std_is_relative_to_each_series_std():
    rng = np.random.default_rng(1)
    clean = [rng.normal(0.0, 1.0, 20_000), 100.0 * np.sin(np.arange(20_000) / 50.0)]
    noisy = add_relative_noise(clean, 0.05, seed=3)
    for before, after in zip(clean, noisy, strict=True):
        # the sample std of 20,000 draws is within 2% of the true one with overwhelming odds
        assert np.std(after - before) == pytest.approx(0.05 * np.std(before), rel=0.02)
    again = add_relative_noise(clean, 0.05, seed=3)
    other = add_relative_noise(clean, 0.05, seed=4)
    assert all(np.array_equal(a, b) for a, b in zip(noisy, again, strict=True))
    assert not np.array_equal(noisy[0], other[0])
    assert add_relative_noise(clean, 0.0, seed=3)[0] is clean[0]


def test_evenly_spaced_keeps_ends_and_order():
    np.testing.assert_array_equal(evenly_spaced(10, 4), [0, 3, 6, 9])
    np.testing.assert_array_equal(evenly_spaced(3, 4), [0, 1, 2])
    np.testing.assert_array_equal(evenly_spaced(5, None), np.arange(5))
