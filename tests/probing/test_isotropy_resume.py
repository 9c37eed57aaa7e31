"""Resuming a fit from a checkpoint continues the probe's trajectory exactly once."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pandas as pd
from lightning.pytorch.callbacks import ModelCheckpoint
from probe_toy import RecordingLogger, ToyData, ToyForecaster, isotropy_probe

KEY = ["epoch", "layer", "metric"]


def _fit(out_dir: Path, max_epochs: int, ckpt_path: Path | None = None):
    L.seed_everything(0)
    model = ToyForecaster()
    probe = isotropy_probe(
        num_windows=8,
        batch_size=3,
        max_tokens=60,
        metrics={"k_max": 4},
        output_dir=str(out_dir),
        pca_layers=[],
    )
    logger = RecordingLogger()
    checkpoints = ModelCheckpoint(
        dirpath=out_dir / "ckpt", filename="{epoch}", save_last=True, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=max_epochs,
        callbacks=[probe, checkpoints],
        logger=logger,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=ToyData(), ckpt_path=ckpt_path)
    return model, logger


def _csv(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, float_precision="round_trip", keep_default_na=False)
    return df.sort_values(KEY, kind="stable").reset_index(drop=True)


def _logged_epochs(logger: RecordingLogger) -> list[int]:
    return [m["probe/epoch"] for _, m in logger.calls if "probe/epoch" in m]


def test_resume_continues_the_trajectory_once_and_equals_an_uninterrupted_run(tmp_path):
    first_dir, moved_dir, full_dir = tmp_path / "first", tmp_path / "moved", tmp_path / "full"
    _fit(first_dir, max_epochs=2)
    first = _csv(first_dir / "probe_metrics.csv")
    _, full_logger = _fit(full_dir, max_epochs=4)
    full = _csv(full_dir / "probe_metrics.csv")
    assert _logged_epochs(full_logger) == [0, 1, 2, 3, 4]

    # resumed into a new output directory: the restored epochs are written first, once
    model, logger = _fit(moved_dir, max_epochs=4, ckpt_path=first_dir / "ckpt" / "last.ckpt")
    resumed = _csv(moved_dir / "probe_metrics.csv")
    assert sorted(resumed["epoch"].unique()) == [0, 1, 2, 3, 4]
    assert not resumed.duplicated(KEY).any()
    pd.testing.assert_frame_equal(resumed[resumed["epoch"] <= 2], first, check_exact=True)
    pd.testing.assert_frame_equal(resumed, full, check_exact=True)
    assert _logged_epochs(logger) == [3, 4]  # loggers get only the new epochs
    assert len(model.probe_calls) == 2 * 3  # two probes of three batches: epoch 0 not redone

    # resumed into its own directory: the file is completed in place
    _fit(first_dir, max_epochs=4, ckpt_path=first_dir / "ckpt" / "last.ckpt")
    pd.testing.assert_frame_equal(_csv(first_dir / "probe_metrics.csv"), full, check_exact=True)
    assert [p.name for p in first_dir.glob("probe_metrics*")] == ["probe_metrics.csv"]

    # resumed from epoch 1 into a directory whose file already holds epochs 2..4: that file is
    # kept aside untouched, the new file holds the trajectory once
    _fit(full_dir, max_epochs=4, ckpt_path=full_dir / "ckpt" / "epoch=0.ckpt")
    (aside,) = full_dir.glob("probe_metrics.replaced-*.csv")
    pd.testing.assert_frame_equal(_csv(aside), full, check_exact=True)
    pd.testing.assert_frame_equal(_csv(full_dir / "probe_metrics.csv"), full, check_exact=True)


def test_resume_on_a_schedule_in_steps_continues_by_step_and_equals_an_uninterrupted_run(tmp_path):
    """Every 3 steps over 4 batches an epoch: steps 0 and 3 in the first epoch, 6 after resume
    (the probe at step 3 labelled epoch 0, at 6 epoch 1), keyed and compared by step."""
    key = ["global_step", "layer", "metric"]

    def fit(out_dir: Path, max_epochs: int, ckpt_path: Path | None = None) -> pd.DataFrame:
        L.seed_everything(0)
        probe = isotropy_probe(
            num_windows=8,
            batch_size=3,
            max_tokens=60,
            metrics={"k_max": 4},
            output_dir=str(out_dir),
            pca_layers=[],
            every_n_steps=3,
        )
        checkpoints = ModelCheckpoint(dirpath=out_dir / "ckpt", save_last=True)
        trainer = L.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=max_epochs,
            callbacks=[probe, checkpoints],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(ToyForecaster(), datamodule=ToyData(), ckpt_path=ckpt_path)
        frame = pd.read_csv(out_dir / "probe_metrics.csv", float_precision="round_trip")
        return frame.sort_values(key, kind="stable").reset_index(drop=True)

    first = fit(tmp_path / "first", max_epochs=1)
    assert sorted(first["global_step"].unique()) == [0, 3]
    full = fit(tmp_path / "full", max_epochs=2)
    assert full.groupby("global_step").epoch.unique().map(list).to_dict() == {
        0: [0],
        3: [0],
        6: [1],
    }
    resumed = fit(tmp_path / "first", 2, ckpt_path=tmp_path / "first" / "ckpt" / "last.ckpt")
    assert not resumed.duplicated(key).any()
    pd.testing.assert_frame_equal(resumed, full, check_exact=True)
