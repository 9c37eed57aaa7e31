"""The isotropy and rank probes under DDP (2 CPU processes, gloo) give the numbers of one
process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
from ddp_probe_run import probes
from probe_toy import ToyData, ToyForecaster

SCRIPT = Path(__file__).with_name("ddp_probe_run.py")


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
    trainer.validate(model, datamodule=ToyData(), verbose=False)
    return {
        probe.csv_name: pd.DataFrame(probe.records).drop(columns=["epoch", "global_step"])
        for probe in callbacks
    }


def _epoch(df: pd.DataFrame, epoch: int) -> pd.DataFrame:
    rows = df[df["epoch"] == epoch].drop(columns=["epoch", "global_step"])
    return rows.reset_index(drop=True).fillna({"note": ""})


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process(tmp_path: Path) -> None:
    ddp_dir = tmp_path / "ddp"
    ddp_dir.mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(ddp_dir), "2"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ddp = {
        name: pd.read_csv(ddp_dir / name, float_precision="round_trip")
        for name in ("probe_metrics.csv", "rank_metrics.csv")
    }
    for records in ddp.values():
        assert sorted(records["epoch"].unique()) == [0, 1]
        assert (records["metric"] != "error").all()

    # probe set of 8 windows in batches of 3 over 2 ranks: rank 0 runs batches 0 and 2, rank 1
    # batch 1 and a padding batch; 60 of the ~75 real tokens per layer are subsampled
    for epoch, weights in ((0, "init.pt"), (1, "final.pt")):
        state = torch.load(ddp_dir / weights, weights_only=True)
        single = _one_process_probe(state, tmp_path / f"single{epoch}")
        for name, records in ddp.items():
            pd.testing.assert_frame_equal(_epoch(records, epoch), single[name], check_exact=True)
