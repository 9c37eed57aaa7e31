"""The window-means file: each probe window's mean real token per layer, saved by the isotropy
probe at epoch 0 and at the latest probe, as safetensors holding the windows' identity (series,
forecast origin); read back checked, and refused with one message when it is anything else."""

from __future__ import annotations

import copy
import json
import pickle
import struct
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from probe_toy import (
    CONTEXT,
    HORIZON,
    ToyData,
    ToyForecaster,
    isotropy_probe,
    tokens_by_hand,
    toy_trainer,
)
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader

from isoprobe.data.windows import WindowDataset
from isoprobe.probing import ProbeCallback
from isoprobe.probing.window_means import (
    DIRECTORY,
    FILES,
    WindowMeansError,
    read_window_means,
    write_window_means,
)

PROBE = dict(num_windows=7, batch_size=3, pca_layers=[], metrics={"metrics": ["cos_inter"]})


class SeriesWindows(L.LightningDataModule):
    """Windows of three noisy sines cut as the data module cuts them (a WindowDataset with its
    (series, forecast origin) rows), every fifth origin."""

    def setup(self, stage: str) -> None:
        rng = np.random.default_rng(0)
        t = np.arange(80)
        series = [np.sin(t / (2 + i) + i) + 0.1 * rng.standard_normal(80) for i in range(3)]
        train = [(s, o) for s in range(3) for o in range(CONTEXT, 50, 3)]
        val = [(s, o) for s in range(3) for o in range(50, 80 - HORIZON + 1, 5)]
        self.train_dataset = WindowDataset(series, np.array(train), CONTEXT, HORIZON)
        self.val_dataset = WindowDataset(series, np.array(val), CONTEXT, HORIZON)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_dataset, batch_size=8)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_dataset, batch_size=8)


def _fit(probe: ProbeCallback, model: ToyForecaster, data: L.LightningDataModule) -> None:
    toy_trainer([probe], max_epochs=2).fit(model, datamodule=data)


def _means_by_hand(model: ToyForecaster, dataset: WindowDataset, windows: list[int]) -> dict:
    per_window = [tokens_by_hand(model, dataset, [i], 1) for i in windows]
    return {
        layer: torch.stack([w[layer].mean(dim=0) for w in per_window])
        for layer in model.probe_layers()
    }


def test_the_probe_saves_each_windows_mean_token_at_epoch_0_and_at_its_last_probe(tmp_path):
    model = ToyForecaster()
    before = copy.deepcopy(model)
    probe = isotropy_probe(output_dir=str(tmp_path), save_window_means=True, **PROBE)
    data = SeriesWindows()
    _fit(probe, model, data)

    dataset = data.val_dataset
    windows = probe.window_indices
    for kind, weights, epoch in (("epoch0", before, 0), ("last", model, 2)):
        saved = read_window_means(tmp_path / DIRECTORY / FILES[kind])
        assert saved.epoch == epoch
        # identity: (series, forecast origin) of each probe window, in probe-set order
        assert saved.identity.tolist() == dataset.starts[windows].tolist()
        expected = _means_by_hand(weights, dataset, windows)
        assert list(saved.layers) == list(expected)  # probe order
        for layer, X in expected.items():
            torch.testing.assert_close(saved.layers[layer], X, rtol=1e-5, atol=1e-6)
    assert not list((tmp_path / DIRECTORY).glob(".*tmp"))  # written whole, then renamed


def test_the_file_is_plain_safetensors(tmp_path):
    path = tmp_path / "means.safetensors"
    means = {"encoder.0": torch.randn(5, 3), "encoder.1": torch.randn(5, 2)}
    write_window_means(path, means, torch.arange(5), torch.arange(10, 15), epoch=4)
    # the safetensors layout: an 8-byte little-endian length, a JSON header, raw tensor bytes
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    assert header["__metadata__"]["epoch"] == "4"
    assert header["mean/encoder.0"]["dtype"] == "F32"
    assert header["series_index"]["dtype"] == "I64"
    tensors = load_file(str(path))  # safetensors alone reads it
    torch.testing.assert_close(tensors["mean/encoder.1"], means["encoder.1"])
    assert tensors["forecast_origin"].tolist() == list(range(10, 15))


def test_a_data_set_without_window_starts_saves_nothing_and_says_why(tmp_path):
    probe = isotropy_probe(output_dir=str(tmp_path), save_window_means=True, **PROBE)
    with pytest.warns(UserWarning, match="window means not saved"):
        _fit(probe, ToyForecaster(), ToyData())
    assert not (tmp_path / DIRECTORY).exists()


class _Payload:
    def __reduce__(self):
        return (print, ("ran",))


@pytest.mark.parametrize(
    "content, reason",
    [
        (pickle.dumps({"mean/encoder.0": _Payload()}), "not a safetensors file"),
        (b"", "not a safetensors file"),
        ("foreign", "not an isoprobe window-means file"),
        ("repeated", "names a window"),
        ("missing", "not those its metadata names"),
    ],
)
def test_a_file_that_is_not_a_window_means_file_is_refused_naming_it(tmp_path, content, reason):
    path = tmp_path / "last.safetensors"
    series, origin = torch.tensor([0, 0, 1]), torch.tensor([5, 6, 5])
    if content == "foreign":
        save_file({"weight": torch.zeros(2)}, str(path))
    elif content == "repeated":
        write_window_means(path, {"a": torch.zeros(3, 2)}, series, torch.tensor([5, 5, 5]), 0)
    elif content == "missing":
        write_window_means(path, {"a": torch.zeros(3, 2)}, series, origin, 0)
        tensors = load_file(str(path))
        del tensors["mean/a"]
        save_file(
            tensors,
            str(path),
            metadata={
                "format": "isoprobe-window-means",
                "version": "1",
                "epoch": "0",
                "layers": '["a"]',
            },
        )
    else:
        path.write_bytes(content)
    with pytest.raises(WindowMeansError, match=reason) as caught:
        read_window_means(path)
    assert str(path) in str(caught.value)


def test_a_resumed_run_keeps_its_epoch_0_file_and_moves_its_last_one_on(tmp_path):
    def fit(max_epochs: int, ckpt_path: Path | None = None) -> None:
        probe = isotropy_probe(output_dir=str(tmp_path), save_window_means=True, **PROBE)
        saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
        L.Trainer(
            callbacks=[probe, saving],
            accelerator="cpu",
            devices=1,
            max_epochs=max_epochs,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            logger=False,
        ).fit(ToyForecaster(), datamodule=SeriesWindows(), ckpt_path=ckpt_path)

    fit(max_epochs=1)
    first = tmp_path / DIRECTORY / FILES["epoch0"]
    before = first.read_bytes()
    assert read_window_means(tmp_path / DIRECTORY / FILES["last"]).epoch == 1
    fit(max_epochs=3, ckpt_path=tmp_path / "ckpt" / "last.ckpt")
    # the resumed run does not probe epoch 0 again: the file of the weights before training
    # stays as the first part wrote it
    assert first.read_bytes() == before
    assert read_window_means(tmp_path / DIRECTORY / FILES["last"]).epoch == 3
