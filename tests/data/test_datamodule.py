"""TimeSeriesDataModule on the constructed series registered in conftest.py."""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import pytest
import torch

from isoprobe.data import TimeSeriesDataModule
from isoprobe.data.datamodule import EpochSampler
from isoprobe.data.registry import UnknownDatasetError

GIVEN = "tests/given_series"


def module(series, **kwargs) -> TimeSeriesDataModule:
    kwargs.setdefault("split", (0.5, 0.25, 0.25))
    dm = TimeSeriesDataModule(GIVEN, dataset_kwargs={"series": series}, **kwargs)
    dm.setup("fit")
    return dm


def items(dataset) -> list[dict]:
    return [dataset[i] for i in range(len(dataset))]


def test_window_lengths_come_from_the_registry_before_setup():
    dm = TimeSeriesDataModule(GIVEN, dataset_kwargs={"series": [[1.0]]})
    assert (dm.context_length, dm.prediction_length, dm.eval_stride) == (3, 2, 2)
    assert dm.collection is None  # nothing loaded yet
    with pytest.raises(RuntimeError, match="setup"):
        _ = dm.season_length
    dm = TimeSeriesDataModule(GIVEN, context_length=5, prediction_length=4)
    assert (dm.context_length, dm.prediction_length) == (5, 4)


def test_segments_hold_the_windows_split_by_time():
    dm = module([np.arange(20.0), 100 + np.arange(10.0)])
    assert dm.freq == "D" and dm.season_length == 1
    val = items(dm.val_dataset)
    assert [(int(i["series_index"]), float(i["target"][0])) for i in val] == [
        (0, 10.0),
        (0, 12.0),
        (1, 105.0),
    ]
    test = items(dm.test_dataset)
    assert [float(i["target"][0]) for i in test] == [15.0, 17.0, 107.0]
    assert torch.equal(test[0]["context"], torch.tensor([12.0, 13.0, 14.0]))
    assert [int(i["window_index"]) for i in test] == [0, 1, 2]
    assert len(dm.train_dataset) == 7
    assert dm.report["windows"] == {"train": 7, "val": 3, "test": 3}


def test_standard_scaling_maps_back_to_the_series():
    rng = np.random.default_rng(2)
    series = rng.normal(20.0, 3.0, 30)
    dm = module([series], scaling="standard", context_length=6, prediction_length=3)
    # length 30: the test segment is [22, 30), so targets start at 22 and 25
    for item, start in zip(items(dm.test_dataset), (22, 25), strict=True):
        context = item["context"].double()
        assert context.mean().item() == pytest.approx(0.0, abs=1e-6)
        assert context.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
        restored = item["target"].double() * item["scale"] + item["loc"]
        np.testing.assert_allclose(restored.numpy(), series[start : start + 3], rtol=1e-5)


def test_nan_values_are_imputed_and_counted(caplog):
    series = np.arange(20.0)
    series[[0, 11, 12]] = [np.nan, np.nan, np.inf]
    with caplog.at_level(logging.WARNING, logger="isoprobe.data.datamodule"):
        dm = module([series])
    assert dm.report["nonfinite_values"] == 3 and dm.report["imputed_values"] == 3
    # the series was a line: interpolation restores it, the edge copies its neighbour
    first_val = dm.val_dataset[0]
    assert torch.equal(first_val["target"], torch.tensor([10.0, 11.0]))
    assert torch.equal(dm.val_dataset[1]["target"], torch.tensor([12.0, 13.0]))
    assert torch.equal(dm.train_dataset[0]["context"], torch.tensor([1.0, 1.0, 2.0]))
    assert sum("nonfinite_values" in r.getMessage() for r in caplog.records) == 1


def test_drop_policy_counts_dropped_windows():
    broken = np.arange(20.0)
    broken[9] = np.nan
    dm = module([broken, np.arange(20.0)], nan_policy="drop")
    assert dm.report["windows_dropped_nonfinite"] == 3
    assert dm.report["windows"] == {"train": 5 + 6, "val": 0 + 2, "test": 2 + 2}
    assert all(torch.isfinite(i["context"]).all() for i in items(dm.train_dataset))


def test_short_series_are_skipped_and_counted():
    dm = module([np.arange(20.0), np.arange(4.0), np.arange(2.0)])
    assert dm.report["series_total"] == 3 and dm.report["series_too_short"] == 2
    assert {int(i["series_index"]) for i in items(dm.train_dataset)} == {0}


def test_all_series_too_short_says_how_to_fix_it():
    with pytest.raises(ValueError, match=r"lengths 3\.\.4\). Lower data.context_length"):
        module([np.arange(4.0), np.arange(3.0)])


def test_the_refusal_suggests_only_what_is_not_already_set():
    short = dict(context_length=1, prediction_length=3)  # no val window, as above
    with pytest.raises(ValueError, match="no val window") as imputing:
        module([np.arange(9.0)], nan_policy="impute", **short)
    assert "nan_policy 'impute'" in str(imputing.value)
    assert "data.nan_policy=impute" not in str(imputing.value)
    with pytest.raises(ValueError, match=r"or use data.nan_policy=impute"):
        module([np.arange(9.0)], nan_policy="drop", **short)


def test_a_segment_without_windows_is_an_error():
    # length 9: the val segment [4, 6) cannot hold a horizon of 3 (test [6, 9) can)
    with pytest.raises(ValueError, match="no val window"):
        module([np.arange(9.0)], context_length=1, prediction_length=3)


def test_a_zero_shot_run_needs_no_training_window():
    """Length 20, split 10 / 5 / 5, context 10: no training window ends inside the first 10
    steps, but validation and test windows exist; a run set up to train is refused by name, one
    set up to validate (task=probe, task=compress) reads the windows it has."""
    series = [np.arange(20.0)]
    lengths = {"context_length": 10, "prediction_length": 3, "eval_stride": 1}
    with pytest.raises(ValueError, match="no train window"):
        module(series, **lengths)
    dm = TimeSeriesDataModule(
        GIVEN, dataset_kwargs={"series": series}, split=(0.5, 0.25, 0.25), **lengths
    )
    dm.setup("validate")
    assert dm.report["windows"] == {"train": 0, "val": 3, "test": 3}
    assert [int(item["target"][0]) for item in items(dm.val_dataset)] == [10, 11, 12]


def test_noise_is_relative_seeded_and_reaches_the_windows():
    clean = 1000.0 * np.sin(np.arange(4000) / 10.0)
    kwargs = dict(noise_std=0.05, seed=7, context_length=10, prediction_length=10)
    first, again = module([clean], **kwargs), module([clean], **kwargs)
    other = module([clean], **{**kwargs, "seed": 8})
    # test targets start at 3000, 3010, ..., 3990 and together cover [3000, 4000)
    targets = torch.cat([i["target"] for i in items(first.test_dataset)]).double().numpy()
    noise = targets - clean[3000:]
    assert np.std(noise) == pytest.approx(0.05 * np.std(clean), rel=0.1)
    assert torch.equal(first.test_dataset[5]["target"], again.test_dataset[5]["target"])
    assert not torch.equal(first.test_dataset[5]["target"], other.test_dataset[5]["target"])


def test_val_order_is_fixed_and_train_order_follows_the_seed():
    series = [np.arange(60.0), np.arange(40.0) * 2]
    a, b = module(series, batch_size=4), module(series, batch_size=4)
    val_a = torch.cat([batch["target"] for batch in a.val_dataloader()])
    val_b = torch.cat([batch["target"] for batch in b.val_dataloader()])
    assert torch.equal(val_a, val_b)
    indices = torch.cat([batch["window_index"] for batch in a.val_dataloader()])
    assert torch.equal(indices, torch.arange(len(a.val_dataset)))

    def train_order(dm, global_seed):
        L.seed_everything(global_seed, verbose=False)
        return torch.cat([batch["window_index"] for batch in dm.train_dataloader()])

    # the order is set by the data module's seed (and the epoch), not by the global generator,
    # so that a resumed run draws what an uninterrupted one drew
    assert torch.equal(train_order(a, 1), train_order(b, 2))
    other_seed = module(series, batch_size=4, seed=3)
    assert not torch.equal(train_order(a, 1), train_order(other_seed, 1))
    assert sorted(train_order(a, 1).tolist()) == list(range(len(a.train_dataset)))


def test_epoch_sampler_draws_a_new_order_each_epoch_and_the_same_one_again():
    epoch = [0]
    sampler = EpochSampler(50, 20, seed=7, epoch=lambda: epoch[0])
    first = list(sampler)
    epoch[0] = 1
    second = list(sampler)
    assert len(first) == len(set(first)) == len(sampler) == 20 and first != second
    epoch[0] = 0
    assert list(sampler) == first


def test_window_caps():
    dm = module([np.arange(200.0)], max_train_windows=10, max_eval_windows=4)
    drawn = torch.cat([batch["window_index"] for batch in dm.train_dataloader()])
    assert len(drawn) == 10 and len(set(drawn.tolist())) == 10
    val_targets = [float(i["target"][0]) for i in items(dm.val_dataset)]
    # 25 val windows at 100, 102, ..., 148: four evenly spaced, the first and the last kept
    assert val_targets == [100.0, 116.0, 132.0, 148.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scaling": "max"}, "data.scaling='max'"),
        ({"nan_policy": "zero"}, "data.nan_policy='zero'"),
        ({"context_length": 0}, "data.context_length must be a positive integer"),
        ({"split": (0.5, 0.5)}, "data.split must be 3 fractions"),
        ({"split": (0.5, 0.3, 0.3)}, "data.split must be 3 fractions"),
        ({"noise_std": -1.0}, "data.noise_std"),
        ({"noise_std": float("inf")}, "data.noise_std must be a finite number"),
        ({"noise_std": float("nan")}, "data.noise_std must be a finite number"),
        ({"split": (0.7, float("nan"), 0.3)}, "data.split must be 3 fractions"),
        ({"path": "/tmp/x.csv"}, "takes no path"),
        ({"dataset_kwargs": {"num_series": 3}}, "takes no num_series"),
    ],
)
def test_bad_options_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TimeSeriesDataModule(GIVEN, **kwargs)


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(UnknownDatasetError, match="unknown data set 'nope'.*vic_elec"):
        TimeSeriesDataModule("nope")


def test_noise_that_overflows_the_float32_windows_is_refused():
    huge = np.full(30, 1e30) + np.arange(30.0) * 1e30  # finite in float64, std ~ 9e30
    with pytest.raises(
        ValueError, match=r"beyond float32.s range.*after data.noise_std=10000000000.0"
    ):
        module([huge], noise_std=1e10, context_length=5, prediction_length=3)


def test_values_the_float32_windows_cannot_hold_are_refused_before_windowing():
    with pytest.raises(ValueError, match="beyond float32's range"):
        module([np.full(30, 1e39)], context_length=5, prediction_length=3)


def test_noise_that_makes_values_infinite_is_refused_by_name():
    with pytest.raises(ValueError, match=r"data.noise_std=1e\+300 made \d+ values of series"):
        module(
            [np.linspace(-1e300, 1e300, 30)], noise_std=1e300, context_length=5, prediction_length=3
        )


def test_a_sweep_loads_each_data_set_once_and_each_job_gets_its_own_copy(monkeypatch):
    from isoprobe.data import registry

    calls = []

    def loader(scale: float = 1.0):
        calls.append(scale)
        series = [np.arange(5.0) * scale]
        return registry.SeriesCollection("counting", series, "D", 7, "test", "none")

    spec = registry.DatasetSpec("counting", loader, 4, 1, True, "test")
    monkeypatch.setitem(registry._REGISTRY, "counting", spec)
    monkeypatch.setattr(registry, "_LOADED", {})
    first = registry.load_series("counting")
    first.series[0][:] = -1.0  # a job changing its copy (imputing, adding noise in place)
    again = registry.load_series("counting")
    np.testing.assert_array_equal(again.series[0], np.arange(5.0))
    registry.load_series("counting", scale=2.0)
    assert calls == [1.0, 2.0]
    unmemoised = registry.DatasetSpec("counting", loader, 4, 1, True, "test", memo=False)
    monkeypatch.setitem(registry._REGISTRY, "counting", unmemoised)
    registry.load_series("counting")
    assert calls == [1.0, 2.0, 1.0]
