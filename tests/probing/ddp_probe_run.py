"""Fit the toy forecaster with the isotropy and rank probes on CPU, in one process or under DDP
(gloo), for the DDP test.

usage: python ddp_probe_run.py OUT_DIR DEVICES

Trains on :class:`isoprobe.data.TimeSeriesDataModule` windows of a registered toy data set, so
that the data module's split of the global batch over the processes is what runs. Writes
OUT_DIR/probe_metrics.csv, OUT_DIR/rank_metrics.csv, OUT_DIR/window_means/*.safetensors, the
model's weights before (init.pt) and after (final.pt) training, and OUT_DIR/writers.txt: one line
"<rank> <file>" per window-means file written, by whichever process wrote it. Lightning re-runs
this script for every other rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import numpy as np
import torch

# this folder (probe_toy) and the repository root: the isoprobe under test, whatever is installed
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2])]

from lightning.pytorch.utilities import rank_zero_only  # noqa: E402
from probe_toy import CONTEXT, HORIZON, ToyForecaster  # noqa: E402

import isoprobe.probing.window_means as window_means_module  # noqa: E402
from isoprobe.data import TimeSeriesDataModule  # noqa: E402
from isoprobe.data.registry import SeriesCollection, register_dataset  # noqa: E402
from isoprobe.probing import ProbeCallback  # noqa: E402

PROBE_SET = dict(num_windows=8, batch_size=3, max_tokens=60, seed=3)
PROBE = dict(PROBE_SET, metrics={"k_max": 4}, save_window_means=True)
SINES = "tests/ddp_sines"
EPOCHS = 2
#: the global batch: 8 windows a step, 4 per process under 2 processes; 4 steps an epoch
DATA = dict(batch_size=8, eval_batch_size=4, max_train_windows=32, max_eval_windows=12, seed=0)


@register_dataset(
    SINES, context_length=CONTEXT, prediction_length=HORIZON, offline=True, domain="tests"
)
def load_sines() -> SeriesCollection:
    """Four noisy sine waves of 160 steps."""
    rng = np.random.default_rng(7)
    t = np.arange(160)
    series = [np.sin(t / (3 + i) + i) + 0.1 * rng.standard_normal(160) for i in range(4)]
    return SeriesCollection(SINES, series, "h", 1, "tests", "none", [f"s{i}" for i in range(4)])


def datamodule() -> TimeSeriesDataModule:
    return TimeSeriesDataModule(SINES, **DATA)


def probes(out_dir: Path) -> list:
    """The probe with the isotropy and rank measures, on one collection pass."""
    return [
        ProbeCallback(
            measures=["isotropy", "rank"],
            isotropy={"metrics": PROBE["metrics"]},
            save_window_means=True,
            output_dir=str(out_dir),
            **PROBE_SET,
        )
    ]


#: a second probe callback, on a schedule in steps: every 3 of the 4 steps an epoch (steps 0, 3
#: and 6, the probe at step 3 in mid-epoch), its files named ``steps_*``
STEP_PROBE = "steps"
EVERY_N_STEPS = 3


def step_probe(out_dir: Path) -> ProbeCallback:
    """The isotropy measures every :data:`EVERY_N_STEPS` optimizer steps."""
    return ProbeCallback(
        measures=["isotropy"],
        isotropy={"metrics": PROBE["metrics"]},
        name=STEP_PROBE,
        every_n_steps=EVERY_N_STEPS,
        output_dir=str(out_dir),
        **PROBE_SET,
    )


def record_writers(out_dir: Path) -> None:
    """Make the probe note in OUT_DIR/writers.txt which rank writes each window-means
    file (the writing itself unchanged)."""
    write = window_means_module.write_window_means

    def noted(path: Path, *args, **kwargs) -> None:
        with (out_dir / "writers.txt").open("a") as handle:
            handle.write(f"{rank_zero_only.rank} {path.name}\n")
        write(path, *args, **kwargs)

    window_means_module.write_window_means = noted


def main(out_dir: Path, devices: int) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    record_writers(out_dir)
    L.seed_everything(0)
    model = ToyForecaster()  # no dropout: its masks are drawn per process
    init = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=EPOCHS,
        callbacks=[*probes(out_dir), step_probe(out_dir)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=datamodule())
    if trainer.is_global_zero:
        torch.save(init, out_dir / "init.pt")
        torch.save(model.state_dict(), out_dir / "final.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
