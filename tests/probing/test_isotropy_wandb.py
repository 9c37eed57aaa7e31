"""What the isotropy and rank probes log to an offline W&B run, read back with
``wandb leet inspect``."""

from __future__ import annotations

import json
import math

import lightning as L
import pandas as pd
import pytest
from lightning.pytorch.loggers import WandbLogger
from probe_toy import ToyData, ToyForecaster

from isoprobe.probing import ProbeCallback
from tests.conftest import wandb_home_env, wandb_records


def _number(value: object) -> float:
    return math.nan if value == "NaN" else float(value)


def test_wandb_gets_probe_values_against_step_a_table_and_point_clouds(tmp_path, monkeypatch):
    for name, value in wandb_home_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    L.seed_everything(0)
    logger = WandbLogger(project="isoprobe-test", save_dir=str(tmp_path), offline=True)
    probe = ProbeCallback(
        measures=["isotropy", "rank"],
        isotropy={"metrics": {"k_max": 4}, "pca_layers": ["encoder.1"]},
        num_windows=8,
        batch_size=3,
        max_tokens=60,
        output_dir=str(tmp_path / "out"),
    )
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        callbacks=[probe],
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    try:
        trainer.fit(ToyForecaster(), datamodule=ToyData())
    finally:
        wandb.finish()

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    records = wandb_records(run_dir)
    axes = [r["metric"] for r in records if r["type"] == "metric"]
    assert ("probe/*", "probe/step") in [(a.get("glob_name"), a.get("step_metric")) for a in axes]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    probed = [h for h in history if "probe/cos_inter/embed" in h]
    assert [h["probe/epoch"] for h in probed] == [0, 1]
    # ToyData: 4 training batches an epoch, so the probe after epoch 1 is at step 4
    assert [h["probe/step"] for h in probed] == [0, 4]

    csv = pd.read_csv(tmp_path / "out" / "probe_metrics.csv", float_precision="round_trip")
    assert len(csv) == 2 * 3 * 14
    for row in csv.itertuples():
        (logged,) = [h for h in probed if h["probe/epoch"] == row.epoch]
        got = _number(logged[f"probe/{row.metric}/{row.layer}"])
        assert got == pytest.approx(row.value, rel=0, abs=0, nan_ok=True)
    for h in probed:
        assert h["probe/table._type"] == "table-file" and h["probe/table.nrows"] == 3 * 14
        assert h["probe/pca/encoder.1._type"] == "object3D-file"
        assert "probe/pca/embed._type" not in h
        # the point cloud: one point per measured token, one RGB colour per k-means cluster
        points = json.loads((run_dir / "files" / h["probe/pca/encoder.1.path"]).read_text())
        epoch_rows = csv[(csv["epoch"] == h["probe/epoch"]) & (csv["layer"] == "encoder.1")]
        value = dict(zip(epoch_rows["metric"], epoch_rows["value"], strict=True))
        assert len(points) == value["n_tokens"] == 60
        assert len({tuple(p[3:6]) for p in points}) == value["n_clusters"]
    assert any("probe/trajectories._type" in h for h in history)

    # the rank probe: its own axis, ranks as in its CSV, the projections' singular values as
    # histograms every probe, the flow-of-ranks picture of the first probe in its row and of
    # the last one when the fit ends (figures_every_n_epochs=0)
    assert ("rank/*", "rank/step") in [(a.get("glob_name"), a.get("step_metric")) for a in axes]
    ranked = [h for h in history if "rank/rank_uncentred_eps0.01/embed" in h]
    assert [h["rank/epoch"] for h in ranked] == [0, 1]
    assert [h["rank/step"] for h in ranked] == [h["probe/step"] for h in probed]
    ranks = pd.read_csv(tmp_path / "out" / "rank_metrics.csv")
    for row in ranks.itertuples():
        (logged,) = [h for h in ranked if h["rank/epoch"] == row.epoch]
        assert float(logged[f"rank/{row.metric}/{row.layer}"]) == row.value
    for h in ranked:
        assert h["rank/spectrum/encoder.0.q._type"] == "histogram"
    assert ranked[0]["rank/flow_of_ranks._type"] == "image-file"
    assert "rank/flow_of_ranks._type" not in ranked[1]
    pictures = [h for h in history if h.get("rank/flow_of_ranks._type") == "image-file"]
    assert len(pictures) == 2 and pictures[1]["_step"] > ranked[1]["_step"]
