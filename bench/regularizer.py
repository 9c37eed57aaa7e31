"""What the isotropy regulariser costs a training step of the default run (target: at most 10%).

The default run's model and data (``python run.py``: the bundled Chronos-T5 on energy, batch
32), one fixed training batch; a step is ``training_step`` + backward + AdamW, without the
regulariser (the reference) and with each penalty on each stack's last block, alternating for
``--rounds`` rounds of ``--steps`` steps, best round of each. Printed: seconds per step and the
ratio to the reference in the same run.

Run: ``.venv/bin/python bench/regularizer.py [--steps 10 --rounds 3]``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from isoprobe.models.build import build_model
from isoprobe.models.regularizer import IsotropyRegularizer

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def seconds_per_step(model, batch, optimiser, regularizer, steps: int) -> float:
    model.regularizer = regularizer
    start = time.perf_counter()
    for _ in range(steps):
        optimiser.zero_grad()
        model.training_step(batch, 0).backward()
        optimiser.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config")
    datamodule = instantiate(cfg.data)
    datamodule.setup("fit")
    model = build_model(cfg.model, datamodule)
    model.log = lambda *a, **k: None  # no Trainer attached: logging is not what is timed
    model.train()
    batch = next(iter(datamodule.train_dataloader()))
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-6)
    variants = {
        "none": None,
        "cos_inter": IsotropyRegularizer(0.1, "cos_inter"),
        "covariance": IsotropyRegularizer(0.1, "covariance"),
    }
    seconds_per_step(model, batch, optimiser, None, 2)  # warm-up
    best = {name: float("inf") for name in variants}
    for _ in range(args.rounds):
        for name, regularizer in variants.items():
            seconds = seconds_per_step(model, batch, optimiser, regularizer, args.steps)
            best[name] = min(best[name], seconds)
    print(f"default run ({cfg.model.name}, {cfg.data.dataset}, batch {batch['context'].shape[0]})")
    print(f"{'regulariser':<12}{'s/step':>10}{'ratio':>8}")
    for name, seconds in best.items():
        print(f"{name:<12}{seconds:>10.4f}{seconds / best['none']:>8.3f}")


if __name__ == "__main__":
    main()
