"""DDP (2 CPU processes, gloo) against one process: the isotropy and rank probes give the numbers
(and the saved window means) of one process for the same weights, and training reproduces one
process's (the global batch split over the processes, no dropout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
from ddp_probe_run import EPOCHS, STEP_PROBE, datamodule, probes
from probe_toy import ToyForecaster

from isoprobe.probing.window_means import DIRECTORY, FILES, read_window_means

SCRIPT = Path(__file__).with_name("ddp_probe_run.py")
RECORDS = ("probe_metrics.csv", "rank_metrics.csv")
#: the step-scheduled probe's records (ddp_probe_run.step_probe)
STEP_RECORDS = f"{STEP_PROBE}_probe_metrics.csv"


def _fit(out_dir: Path, devices: int) -> dict[str, pd.DataFrame]:
    """Run ddp_probe_run.py on ``devices`` CPU processes; its probe records."""
    out_dir.mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(out_dir), str(devices)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = (*RECORDS, STEP_RECORDS)
    return {name: pd.read_csv(out_dir / name, float_precision="round_trip") for name in names}


def _one_process_probe(weights: dict, out_dir: Path) -> dict[str, pd.DataFrame]:
    """Each probe's records of ``weights`` in this process (trainer.validate probes once)."""
    model = ToyForecaster()
    model.load_state_dict(weights)
    callbacks = probes(out_dir)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.validate(model, datamodule=datamodule(), verbose=False)
    (probe,) = callbacks
    return {
        spec.csv_name: pd.DataFrame(probe.records_of(group)).drop(columns=["epoch", "global_step"])
        for group, spec in probe.specs.items()
    }


def _epoch(df: pd.DataFrame, epoch: int) -> pd.DataFrame:
    rows = df[df["epoch"] == epoch].drop(columns=["epoch", "global_step"])
    return rows.reset_index(drop=True).fillna({"note": ""})


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process(tmp_path: Path) -> None:
    ddp = _fit(tmp_path / "ddp", devices=2)
    by_steps = ddp.pop(STEP_RECORDS)
    assert by_steps.groupby("global_step").epoch.unique().map(list).to_dict() == {
        0: [0],
        3: [0],
        6: [1],
    }
    for records in ddp.values():
        assert sorted(records["epoch"].unique()) == list(range(EPOCHS + 1))
        assert (records["metric"] != "error").all()

    # the probe, same weights: probe set of 8 windows in batches of 3 over 2 ranks: rank 0
    # runs batches 0 and 2, rank 1 batch 1 and a padding batch; 60 of the real tokens per layer
    # are subsampled. Exactly one process's numbers.
    for epoch, weights in ((0, "init.pt"), (EPOCHS, "final.pt")):
        state = torch.load(tmp_path / "ddp" / weights, weights_only=True)
        single = _one_process_probe(state, tmp_path / f"single{epoch}")
        for name, records in ddp.items():
            pd.testing.assert_frame_equal(_epoch(records, epoch), single[name], check_exact=True)
        # the window means rank 0 saved: one process's, window for window (gathered back into
        # probe-set order from the ranks' batches)
        kind = "epoch0" if epoch == 0 else "last"
        saved = read_window_means(tmp_path / "ddp" / DIRECTORY / FILES[kind])
        alone = read_window_means(tmp_path / f"single{epoch}" / DIRECTORY / FILES["last"])
        assert saved.epoch == epoch
        assert torch.equal(saved.identity, alone.identity)
        assert list(saved.layers) == list(alone.layers)
        for layer, means in alone.layers.items():
            torch.testing.assert_close(saved.layers[layer], means, rtol=1e-6, atol=0.0)
    # only rank 0 writes them: both files at epoch 0, the last one again after each epoch
    writers = (tmp_path / "ddp" / "writers.txt").read_text().split("\n")[:-1]
    expected = [FILES["epoch0"], *[FILES["last"]] * (EPOCHS + 1)]
    assert sorted(writers) == sorted(f"0 {name}" for name in expected)

    # training: each process takes half of every global batch of 8 windows (the same windows in
    # the same order as one process), DDP averages the gradients: one process's weights and probe
    # numbers after every epoch, up to float32 summation order
    one = _fit(tmp_path / "one", devices=1)
    # the schedule in steps: the same probes, step for step, as one process
    pd.testing.assert_frame_equal(
        by_steps.fillna({"note": ""}),
        one.pop(STEP_RECORDS).fillna({"note": ""}),
        rtol=1e-4,
        atol=1e-6,
    )
    trained = torch.load(tmp_path / "ddp" / "final.pt", weights_only=True)
    reference = torch.load(tmp_path / "one" / "final.pt", weights_only=True)
    assert trained.keys() == reference.keys()
    for key, value in reference.items():
        torch.testing.assert_close(trained[key], value, rtol=1e-4, atol=1e-5, msg=key)
    for name, records in ddp.items():
        for epoch in range(EPOCHS + 1):
            pd.testing.assert_frame_equal(
                _epoch(records, epoch), _epoch(one[name], epoch), rtol=1e-4, atol=1e-6
            )
