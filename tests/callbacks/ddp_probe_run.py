"""Fit the toy forecaster with the isotropy and rank probes under DDP on CPU (gloo) for the
DDP test.

usage: python ddp_probe_run.py OUT_DIR DEVICES

Writes OUT_DIR/probe_metrics.csv, OUT_DIR/rank_metrics.csv and the model's weights before
(init.pt) and after (final.pt) training. Lightning re-runs this script for every other rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from isoprobe.callbacks import IsotropyProbe, RankProbe  # noqa: E402
from probe_toy import ToyData, ToyForecaster  # noqa: E402

PROBE_SET = dict(num_windows=8, batch_size=3, max_tokens=60, seed=3)
PROBE = dict(PROBE_SET, metrics={"k_max": 4})


def probes(out_dir: Path) -> list:
    """Both probes, sharing one collection pass."""
    return [
        IsotropyProbe(output_dir=str(out_dir), **PROBE),
        RankProbe(output_dir=str(out_dir), **PROBE_SET),
    ]


def main(out_dir: Path, devices: int) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    L.seed_everything(0)
    model = ToyForecaster()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=1,
        callbacks=probes(out_dir),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=ToyData())
    if trainer.is_global_zero:
        torch.save(init, out_dir / "init.pt")
        torch.save(model.state_dict(), out_dir / "final.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
