"""Low-rank attention by design against the full-rank model and a constant-rank model of the same
size, pretrained side by side for the same steps (the rank-structure paper's table 3 contrast).

Three Chronos-T5 "mini" pretrainings on KernelSynth (``experiment=pretrain_chronos``, the same
seed, data and steps): ``full`` (dense attention), ``flow`` (``model.low_rank``: rank
r_l = r_1 + (r_D - r_1)((l - 1)/(D - 1))^alpha per stack) and ``constant`` (every block at the
flow schedule's mean rank, so the attention has the same number of weights: alpha = 0). Printed:
attention and total parameters, wall time, and the test split's WQL, MASE and NMSE of each,
relative to ``full``.

Run: ``.venv/bin/python bench/low_rank.py [--steps 300 --r-first 16 --alpha 0.5]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from isoprobe.models.compression import flow_of_ranks_schedule
from isoprobe.tasks import run_task

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
LAYERS, WIDTH = 4, 128  # the mini shape of configs/model/chronos.yaml


def pretrain(out: Path, steps: int, overrides: list[str]) -> tuple[dict, float]:
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "experiment=pretrain_chronos",
                f"trainer.max_steps={steps}",
                "trainer.enable_progress_bar=false",
                "logger=none",
                "callbacks=none",
                *overrides,
            ],
            return_hydra_config=True,
        )
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        cfg.hydra.runtime.output_dir = str(out)
    HydraConfig().set_config(cfg)
    started = time.perf_counter()
    results = run_task(cfg)
    return results, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--r-first", type=int, default=16)
    parser.add_argument("--r-last", type=int, default=WIDTH // 2)
    parser.add_argument("--alpha", type=float, default=0.5)
    args = parser.parse_args()
    flow = flow_of_ranks_schedule(LAYERS, args.r_first, args.r_last, args.alpha)
    constant = round(sum(flow) / len(flow))
    variants = {
        "full": [],
        "flow": [
            "model.low_rank.enabled=true",
            f"model.low_rank.r_first={args.r_first}",
            f"model.low_rank.r_last={args.r_last}",
            f"model.low_rank.alpha={args.alpha}",
        ],
        "constant": [
            "model.low_rank.enabled=true",
            f"model.low_rank.r_first={constant}",
            f"model.low_rank.r_last={constant}",
            "model.low_rank.alpha=0",
        ],
    }
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, overrides in variants.items():
            results, seconds = pretrain(Path(tmp) / name, args.steps, overrides)
            rows[name] = {**results["after"], "seconds": seconds}
    ranks = {"full": f"{WIDTH} (dense)", "flow": str(flow), "constant": str([constant] * LAYERS)}
    attention = {
        "full": WIDTH * WIDTH,
        "flow": sum(r * 2 * WIDTH for r in flow) / LAYERS,
        "constant": constant * 2 * WIDTH,
    }
    print(f"\nChronos-T5 mini pretrained {args.steps} steps on KernelSynth; ratios to full")
    print(
        f"{'variant':<10}{'ranks per block':>22}{'attn size':>11}{'time':>8}"
        f"{'WQL':>8}{'MASE':>8}{'NMSE':>8}"
    )
    for name, row in rows.items():
        full = rows["full"]
        print(
            f"{name:<10}{ranks[name]:>22}{attention[name] / attention['full']:>11.3f}"
            f"{row['seconds'] / full['seconds']:>8.2f}"
            + "".join(
                f"{row[f'test/{m}'] / full[f'test/{m}']:>8.3f}" for m in ("wql", "mase", "nmse")
            )
        )
    print(
        "absolute (full): "
        + ", ".join(f"{m} {rows['full'][f'test/{m}']:.4f}" for m in ("wql", "mase", "nmse"))
    )


if __name__ == "__main__":
    main()
