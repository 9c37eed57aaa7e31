"""A measure registered with isoprobe.metrics.register_measure runs in the isotropy probe under
``metrics: all`` with no change to the callback, and one across consecutive layers (linear CKA)
reads the previous layer's tokens."""

from __future__ import annotations

import math

import lightning as L
import pytest
from probe_toy import ToyData, ToyForecaster, ToyWindows, isotropy_probe, tokens_by_hand
from torch import Tensor

from isoprobe.metrics import Tokens, register_measure, unregister_measure

LAYERS = ["embed", "encoder.0", "encoder.1"]


def linear_cka(X: Tensor, Y: Tensor) -> float:
    """Linear CKA of two token matrices whose rows are the same tokens (Kornblith et al. 2019)."""
    X, Y = X - X.mean(0), Y - Y.mean(0)
    return float((Y.T @ X).norm() ** 2 / ((X.T @ X).norm() * (Y.T @ Y).norm()))


@pytest.fixture
def cka_to_previous():
    @register_measure("cka_previous")
    def _cka_previous(tokens: Tokens) -> dict[str, float]:
        previous = tokens.previous
        if previous is None or previous.n != tokens.n:
            return {"cka_previous": math.nan}
        return {"cka_previous": linear_cka(previous.X, tokens.X)}

    yield
    unregister_measure("cka_previous")


def test_a_registered_cross_layer_measure_runs_without_a_new_callback(tmp_path, cka_to_previous):
    L.seed_everything(0)
    model, data = ToyForecaster(), ToyData()
    probe = isotropy_probe(
        output_dir=str(tmp_path),
        num_windows=8,
        batch_size=3,
        max_tokens=10_000,
        pca_layers=[],
        metrics={"k_max": 4},
    )
    trainer = L.Trainer(
        callbacks=[probe],
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
    )
    trainer.validate(model, datamodule=data, verbose=False)

    got = {r["layer"]: r["value"] for r in probe.records if r["metric"] == "cka_previous"}
    assert list(got) == LAYERS and math.isnan(got["embed"])
    tokens = tokens_by_hand(model, data.val_dataset, list(range(8)), batch_size=3)
    observed = int(ToyWindows(10, seed=2).observed[:8].sum())
    assert all(t.shape[0] == observed for t in tokens.values())  # the same tokens in each layer
    for previous, layer in zip(LAYERS, LAYERS[1:], strict=False):
        expected = linear_cka(tokens[previous].double(), tokens[layer].double())
        assert got[layer] == pytest.approx(expected, rel=1e-9)
    assert all(0 < got[layer] <= 1 + 1e-12 for layer in LAYERS[1:])
