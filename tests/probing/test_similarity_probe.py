"""The isotropy probe's similarity measures: drift (1 - linear CKA of a layer now against
epoch 0) and layer-against-layer CKA, on the toy model and, under model.adapt=head_only, on a
real model whose probed layers do not train: every drift is exactly 0 there."""

from __future__ import annotations

import copy

import lightning as L
import pandas as pd
import pytest
from probe_toy import ToyData, ToyForecaster, isotropy_probe, tokens_by_hand, toy_trainer

from isoprobe.metrics import linear_cka
from isoprobe.tasks import run_task

PROBE_SET = dict(num_windows=6, batch_size=3, max_tokens=10_000)


def _fit(callbacks: list, model: ToyForecaster, max_epochs: int = 1) -> None:
    toy_trainer(callbacks, max_epochs=max_epochs).fit(model, datamodule=ToyData())


def test_drift_and_layer_pairs_are_linear_cka_of_the_collected_tokens(tmp_path):
    L.seed_everything(0)  # an unseeded toy sometimes moved a block by less than the bound below
    model = ToyForecaster()
    before = copy.deepcopy(model)
    probe = isotropy_probe(
        output_dir=str(tmp_path),
        pca_layers=[],
        metrics={"metrics": ["cos_inter"]},
        similarity={},
        figures_every_n_epochs=1,
        **PROBE_SET,
    )
    _fit([probe], model)
    assert probe.passes == 2  # one pass per probed epoch

    records = pd.DataFrame(probe.records).set_index(["epoch", "layer", "metric"]).value
    data = ToyData()
    data.setup("fit")
    windows = list(range(6))
    then = tokens_by_hand(before, data.val_dataset, windows, 3)
    now = tokens_by_hand(model, data.val_dataset, windows, 3)
    for layer in ("embed", "encoder.0", "encoder.1"):
        assert records[(0, layer, "cka_drift")] == 0.0
        assert records[(1, layer, "cka_drift")] == pytest.approx(
            1 - linear_cka(now[layer], then[layer]), abs=1e-6
        )
    for layer in ("encoder.0", "encoder.1"):
        assert records[(1, layer, "cka_drift")] > 1e-4  # SGD moved the blocks
    # the toy's embedding is affine in the value (its other input, "observed", is 1 on every
    # real token): a line whatever SGD does to it, and CKA ignores maps of a line onto a line
    assert records[(1, "embed", "cka_drift")] == pytest.approx(0.0, abs=1e-12)
    assert records[(1, "encoder.1", "cka_prev")] == pytest.approx(
        linear_cka(now["encoder.1"], now["encoder.0"]), abs=1e-6
    )
    pairs = pd.read_csv(tmp_path / "cka_layers.csv")
    assert sorted(pairs.epoch.unique()) == [0, 1] and len(pairs) == 2 * 9
    assert (tmp_path / "cka_layers" / "epoch0.png").is_file()
    assert (tmp_path / "cka_layers" / "epoch1.png").is_file()


SHORT = [
    "model.checkpoint=scratch",
    "model.allow_random_weights=true",
    "data.max_train_windows=16",
    "data.max_eval_windows=4",
    "trainer.max_epochs=1",
    "task.evaluate_before=false",
    "task.evaluate_after=false",
    "logger=none",
    "callbacks.probe.num_windows=4",
    "callbacks.probe.isotropy.metrics.metrics=[cos_inter]",
    "callbacks.probe.measures=[isotropy,cka,readout]",
    "~callbacks.model_checkpoint",
]


@pytest.mark.parametrize(("adapt", "moves"), [("head_only", False), ("full", True)])
def test_under_head_only_every_probed_layer_drifts_exactly_zero(
    tiny_config, tmp_path, adapt, moves
):
    # PatchTST: its head is its own (Chronos-T5's is tied to the input embedding, which
    # head_only then trains too)
    run_task(tiny_config(*SHORT, f"model.adapt={adapt}", model="patchtst"))
    records = pd.read_csv(tmp_path / "probe_metrics.csv")
    drift = records[records.metric == "cka_drift"].set_index(["epoch", "layer"]).value
    layers = set(records[records.metric == "cka_drift"].layer)
    assert {"embed", "encoder.0", "encoder.1"} <= layers
    assert (drift.loc[0] == 0.0).all()
    after = drift.loc[1]
    assert set(after.index) == layers
    if moves:
        assert (after > 0).any()
    else:
        assert (after == 0.0).all(), after[after != 0.0]
