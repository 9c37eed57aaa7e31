"""The probes' share of a default fine-tuning epoch, for every model.

For each ``model=<name>`` (default: every ``configs/model/*.yaml``), the default run
``python run.py model=<name> data=energy`` (default callbacks: the isotropy and the rank probe,
sharing one collection pass) is fine-tuned for ``--epochs`` epochs with the logger off, and the
wall time of the probes' end-of-epoch hooks (forward pass, metrics, CSV, plots) is divided by
the wall time of the whole epoch (training, validation with forecasts, probes): two clocks,
before and after the probes in the callback list, measure both inside the same epoch. The
probes' figures are drawn on a background thread, whose work lands in the training loop's time
rather than in the hooks', so the same run is also made without probes and the overhead
``1 - epoch without probes / epoch with probes`` is printed beside the share; both count against
the target (the forecasters issue): at most 15% for every model.

The default probe now also measures drift, layer-against-layer CKA and the readout
(the ``cka`` and ``readout`` measure sets); the same run is made a third time with both
off (the probe as it was before them) and ``vs before`` = epoch with them / epoch without them
- 1 is printed: the target is at most 10%.

Run: ``.venv/bin/python bench/probe_share.py [--models chronos patchtst] [--epochs 1]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import lightning as L
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from lightning.pytorch import Callback

from isoprobe.tasks.runner import build_model

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
TARGET = 0.15
#: the most the depth measures (drift, CKA, readout) may add to a default epoch
DEPTH_TARGET = 0.10
#: the probe as it was before the depth measures
WITHOUT_DEPTH = ["callbacks.probe.measures=[isotropy,rank]"]


class EpochClock(Callback):
    """Marks the time of every epoch start and of its ``on_train_epoch_end`` hook."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.starts.append(time.perf_counter())

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.ends.append(time.perf_counter())


def probe_share_of_epoch(
    model: str, epochs: int, overrides: list[str], with_probes: bool = True
) -> list[tuple[int, float, float]]:
    """(epoch, probes' seconds, epoch seconds) of ``model``'s default fine-tuning run (without
    its probes: ``with_probes=False``)."""
    with tempfile.TemporaryDirectory() as out:
        GlobalHydra.instance().clear()
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[
                    f"model={model}",
                    "data=energy",
                    f"trainer.max_epochs={epochs}",
                    "trainer.enable_progress_bar=false",
                    "+trainer.enable_checkpointing=false",
                    f"paths.output_dir={out}",
                    *overrides,
                ],
            )
        L.seed_everything(cfg.seed)
        datamodule = instantiate(cfg.data)
        datamodule.prepare_data()
        datamodule.setup("fit")
        module = build_model(cfg.model, datamodule)
        probes = [
            instantiate(c)
            for name, c in cfg.callbacks.items()
            if with_probes and c and name != "model_checkpoint" and "_target_" in c
        ]
        before, after = EpochClock(), EpochClock()
        trainer = instantiate(cfg.trainer, callbacks=[before, *probes, after], logger=False)
        trainer.fit(module, datamodule=datamodule)
    clocks = zip(after.starts, before.ends, after.ends, strict=True)
    return [(e + 1, end - mid, end - start) for e, (start, mid, end) in enumerate(clocks)]


def main() -> None:
    models = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=models, choices=models)
    parser.add_argument("--epochs", type=int, default=1, help="fine-tuning epochs timed")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides of every run")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; target: probes <= {TARGET:.0%} of an epoch")
    print(
        f"{'model':<14}{'epoch':>6}{'probes s':>10}{'epoch s':>10}{'share':>8}"
        f"{'no-probe epoch s':>18}{'overhead':>10}{'no-depth epoch s':>18}{'vs before':>11}"
    )
    for model in args.models:
        probed = probe_share_of_epoch(model, args.epochs, args.override)
        bare = probe_share_of_epoch(model, args.epochs, args.override, with_probes=False)
        before = probe_share_of_epoch(model, args.epochs, [*args.override, *WITHOUT_DEPTH])
        for (epoch, probe_s, epoch_s), (_, _, bare_s), (_, _, before_s) in zip(
            probed, bare, before, strict=True
        ):
            share, overhead, added = probe_s / epoch_s, 1 - bare_s / epoch_s, epoch_s / before_s - 1
            over = max(share, overhead) > TARGET or added > DEPTH_TARGET
            print(
                f"{model:<14}{epoch:>6}{probe_s:>10.1f}{epoch_s:>10.1f}{share:>8.1%}"
                f"{bare_s:>18.1f}{overhead:>10.1%}{before_s:>18.1f}{added:>11.1%}"
                f"{'  over target' if over else ''}"
            )


if __name__ == "__main__":
    main()
