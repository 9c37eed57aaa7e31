"""A user's module adds a measure of each kind (tokens, pair, windows, weights) with no edit
inside isoprobe: named in ``callbacks.probe.plugins`` and ``callbacks.probe.measures``, with
its parameters in the config, each runs in the probe and its values equal an independent
computation (numpy, scipy) on the tokens, windows and weights gathered by hand."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
from probe_toy import ToyData, ToyForecaster, tokens_by_hand, toy_trainer
from scipy.linalg import orthogonal_procrustes

from isoprobe.metrics import unregister_measure
from isoprobe.probing import ProbeCallback
from isoprobe.probing.measure_kinds import scaled_horizon

PLUGIN = textwrap.dedent(
    """
    from dataclasses import dataclass

    import torch

    from isoprobe.metrics import register_measure


    @dataclass(frozen=True)
    class TopShare:
        k: int = 1


    @register_measure("top_share", kind="tokens", params=TopShare)
    def top_share(tokens, options):
        values = tokens.eigenvalues
        return {"top_share": float(values[: options.k].sum() / values.sum())}


    def unit_centred(X):
        X = X.double() - X.double().mean(dim=0)
        return X / X.norm()


    def procrustes(a, b):
        # min over orthogonal R of ||a R - b||_F^2 for unit-norm a, b: 2 - 2 ||a^T b||_*
        return float(2 - 2 * torch.linalg.svdvals(a.T @ b).sum())


    @register_measure("procrustes_drift", kind="pair", pairing="drift", prepare=unit_centred)
    def procrustes_drift(now, before):
        return {"procrustes_drift": procrustes(now, before)}


    @register_measure("procrustes_prev", kind="pair", pairing="prev", prepare=unit_centred)
    def procrustes_prev(layer, previous):
        return {"procrustes_prev": procrustes(layer, previous)}


    @dataclass(frozen=True)
    class NormTarget:
        step: int = 0


    @register_measure("norm_target_corr", kind="windows", params=NormTarget)
    def norm_target_corr(features, targets, options):
        norms, target = features.norm(dim=1), targets[:, options.step]
        both = torch.stack([norms, target])
        return {"norm_target_corr": float(torch.corrcoef(both)[0, 1])}


    @dataclass(frozen=True)
    class Norm:
        order: float = 2.0


    @register_measure("weight_norm", kind="weights", params=Norm, key_pattern=r"norm_[qkvo]")
    def weight_norm(projections, options):
        return {
            f"norm_{p}": float(torch.linalg.matrix_norm(W.double(), ord=options.order))
            for p, W in projections.items()
        }
    """
)
MEASURES = ["top_share", "procrustes_drift", "procrustes_prev", "norm_target_corr", "weight_norm"]
LAYERS = ["embed", "encoder.0", "encoder.1"]
WINDOWS = 8


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "user_measures.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "user_measures"
    for name in MEASURES:
        unregister_measure(name)
    sys.modules.pop("user_measures", None)


def _probe(plugin: str, directory, **options) -> ProbeCallback:
    return ProbeCallback(
        measures=["isotropy", "procrustes_drift", "procrustes_prev", "norm_target_corr"]
        + ["weight_norm"],
        plugins=[plugin],
        isotropy={"metrics": {"metrics": ["top_share"], "params": {"top_share": {"k": 2}}}},
        norm_target_corr={"step": 1},
        weight_norm={"order": 1.0},
        output_dir=str(directory),
        num_windows=WINDOWS,
        batch_size=3,
        max_tokens=10_000,
        **options,
    )


def _procrustes(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(axis=0), b - b.mean(axis=0)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)
    rotation, _ = orthogonal_procrustes(a, b)
    return float(np.linalg.norm(a @ rotation - b) ** 2)


def test_a_plugin_measure_of_each_kind_runs_by_config_and_equals_an_independent_computation(
    plugin, tmp_path
):
    torch.manual_seed(0)
    model, data = ToyForecaster(), ToyData()
    data.setup("fit")
    windows = list(range(WINDOWS))
    before = {
        k: v.double().numpy()
        for k, v in tokens_by_hand(model, data.val_dataset, windows, 3).items()
    }
    probe = _probe(plugin, tmp_path)
    toy_trainer([probe]).fit(model, datamodule=data)
    after = {
        k: v.double().numpy()
        for k, v in tokens_by_hand(model, data.val_dataset, windows, 3).items()
    }

    rows = pd.read_csv(tmp_path / "probe_metrics.csv")
    last = rows[rows.epoch == 1].set_index(["layer", "metric"]).value
    for layer in LAYERS:  # tokens, with its parameter k = 2
        spectrum = np.sort(np.linalg.eigvalsh(np.cov(after[layer].T)))[::-1]
        assert last[(layer, "top_share")] == pytest.approx(spectrum[:2].sum() / spectrum.sum())
        drift = _procrustes(after[layer], before[layer])  # pair: now against step 0
        assert last[(layer, "procrustes_drift")] == pytest.approx(drift, abs=1e-9)
    assert ("embed", "procrustes_prev") not in last  # pair: against the layer before
    for previous, layer in zip(LAYERS, LAYERS[1:], strict=False):
        expected = _procrustes(after[layer], after[previous])
        assert last[(layer, "procrustes_prev")] == pytest.approx(expected, abs=1e-9)
    at_step_0 = rows[rows.global_step == 0].set_index(["layer", "metric"]).value
    assert all(abs(at_step_0[(layer, "procrustes_drift")]) < 1e-9 for layer in LAYERS)

    by_window = [tokens_by_hand(model, data.val_dataset, [i], 1) for i in windows]
    targets = np.stack(
        [
            scaled_horizon(data.val_dataset[i]["context"], data.val_dataset[i]["target"])
            for i in windows
        ]
    )
    for layer in LAYERS:  # windows: each window's mean real token, its scaled horizon's step 1
        norms = [np.linalg.norm(w[layer].double().mean(dim=0).numpy()) for w in by_window]
        expected = np.corrcoef(norms, targets[:, 1])[0, 1]
        assert last[(layer, "norm_target_corr")] == pytest.approx(expected, abs=1e-6)

    ranks = pd.read_csv(tmp_path / "rank_metrics.csv")  # weights: their own output group
    norms = ranks[ranks.epoch == 1].set_index(["layer", "metric"]).value
    for block, projections in model.attention_weights().items():
        for p, W in projections.items():
            expected = np.linalg.norm(W.detach().double().numpy(), 1)
            assert norms[(block, f"norm_{p}")] == pytest.approx(expected, rel=1e-12)


def test_a_measures_unknown_option_and_an_option_of_nothing_named_are_refused(plugin, tmp_path):
    with pytest.raises(
        ValueError, match=r"callbacks.probe.weight_norm: .* no option\(s\) \['ord'\]"
    ):
        ProbeCallback(measures=["weight_norm"], plugins=[plugin], weight_norm={"ord": 1})
    with pytest.raises(ValueError, match=r"no setting \['procrustes'\]"):
        ProbeCallback(plugins=[plugin], procrustes={"scaled": True})
    with pytest.raises(ValueError, match=r"'top_share' is a tokens measure.*isotropy.metrics"):
        ProbeCallback(measures=["top_share"], plugins=[plugin])
