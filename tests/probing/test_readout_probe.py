"""The isotropy probe's readout: per layer, the ridge readout of the scaled horizon from each
probe window's mean real token, fitted on the first half of the windows and scored on the
rest, from the same pass as the other measures."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from probe_toy import ToyData, ToyForecaster, isotropy_probe, tokens_by_hand, toy_trainer

from isoprobe.metrics.readout import ridge_readout
from isoprobe.probing.measure_kinds import scaled_horizon


def test_the_readout_fits_each_layers_window_means_to_the_scaled_horizon(tmp_path):
    model = ToyForecaster()
    iso = isotropy_probe(
        output_dir=str(tmp_path),
        pca_layers=[],
        metrics={"metrics": ["cos_inter"]},
        num_windows=10,
        batch_size=4,
        readout={"train_fraction": 0.5},
    )
    toy_trainer([iso]).fit(model, datamodule=ToyData())
    assert len(model.probe_calls) == 2 * 3  # one pass per probed epoch, 10 windows in 3 batches

    data = ToyData()
    data.setup("fit")
    windows = data.val_dataset
    by_window = [tokens_by_hand(model, windows, [i], 1) for i in range(10)]
    targets = torch.stack(
        [scaled_horizon(windows[i]["context"], windows[i]["target"]) for i in range(10)]
    )
    records = pd.read_csv(tmp_path / "probe_metrics.csv")
    last = records[records.epoch == 1].set_index(["layer", "metric"]).value
    for layer in ("embed", "encoder.0", "encoder.1"):
        features = torch.stack([w[layer].double().mean(dim=0) for w in by_window])
        expected = ridge_readout(features[:5], targets[:5], features[5:], targets[5:])
        assert last[(layer, "readout_nmse")] == pytest.approx(expected.nmse, rel=1e-5)
        assert last[(layer, "readout_skill")] == pytest.approx(expected.skill, abs=1e-5)


def test_scaled_horizon_divides_by_the_mean_absolute_observed_context():
    context = torch.tensor([float("nan"), -2.0, 4.0])
    assert torch.equal(
        scaled_horizon(context, torch.tensor([3.0, 6.0])),
        torch.tensor([1.0, 2.0], dtype=torch.float64),
    )
    assert torch.equal(
        scaled_horizon(torch.zeros(3), torch.tensor([3.0])),
        torch.tensor([3.0], dtype=torch.float64),
    )
