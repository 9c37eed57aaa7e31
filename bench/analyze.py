"""How long task=analyze takes on a large sweep, without and with the bootstrap.

Writes N synthetic run directories (``.hydra/config.yaml``, ``summary.json``,
``probe_metrics.csv``: one zero-shot probe, L layers × M metrics, three models × several data
sets), then times reading them into the study table and computing every correlation, first
with no bootstrap or permutations (the target: ≤ 10 s for 1000 runs × 20 layers × 15 metrics)
and then with 1000 of each. The reference for the ratio is the time to read the same CSV files
with pandas alone, measured in the same run.

    .venv/bin/python bench/analyze.py [--runs 1000 --layers 20 --metrics 15]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from tqdm import tqdm

from isoprobe.analysis.correlations import correlations
from isoprobe.analysis.study import load_study

MODELS = ("chronos", "chronos_bolt", "moirai")
DATASETS = tuple(f"kernelsynth_{i}" for i in range(10))


def write_runs(root: Path, runs: int, layers: int, metrics: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    names = ["embed", *(f"encoder.{i}" for i in range(layers - 1))]
    keys = [f"metric_{j}" for j in range(metrics)]
    for r in tqdm(range(runs), desc="writing synthetic runs"):
        run = root / str(r)
        (run / ".hydra").mkdir(parents=True)
        config = {
            "task": {"name": "probe"},
            "model": {"name": MODELS[r % 3], "checkpoint": "bundled"},
            "data": {
                "dataset": DATASETS[r % 10],
                "context_length": 512,
                "prediction_length": 64,
                "noise_std": 0.0,
            },
            "seed": 42,
            "callbacks": {"probe": {"num_windows": 64, "max_tokens": 4000}},
        }
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        quality = rng.normal()
        before = {
            f"test/{m}": float(np.exp(quality + rng.normal(scale=0.3)))
            for m in ("nmse", "mase", "wql")
        }
        (run / "summary.json").write_text(json.dumps({"task": "probe", "before": before}))
        values = rng.normal(size=(layers, metrics)) + quality
        rows = pd.DataFrame(
            {
                "probe": "isotropy",
                "epoch": 0,
                "global_step": 0,
                "layer": np.repeat(names, metrics),
                "metric": np.tile(keys, layers),
                "value": values.ravel(),
                "note": "",
            }
        )
        rows.to_csv(run / "probe_metrics.csv", index=False)


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--metrics", type=int, default=15)
    parser.add_argument("--resamples", type=int, default=1000, help="bootstrap and permutations")
    args = parser.parse_args()
    import isoprobe.data  # noqa: F401  (task=analyze runs with it imported: not timed here)

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_runs(root, args.runs, args.layers, args.metrics)
        files = sorted(root.glob("*/probe_metrics.csv"))
        _, reading = timed(lambda: [pd.read_csv(f) for f in files])
        study, loading = timed(load_study, [str(root)])
        table, fast = timed(correlations, study, n_boot=0, n_perm=0)
        n = args.resamples
        full = timed(correlations, study, n_boot=n, n_perm=n)[1] if n else None
    tests = len(table)
    print(f"{args.runs} runs x {args.layers} layers x {args.metrics} metrics; {tests} tests")
    print(f"reading the CSVs with pandas alone (reference): {reading:6.2f} s")
    print(
        f"load_study (study table):                      {loading:6.2f} s "
        f"({loading / reading:.2f}x the reference)"
    )
    print(f"correlations without bootstrap/permutations:   {fast:6.2f} s")
    print(f"analysis without the bootstrap (target 10 s):  {loading + fast:6.2f} s")
    if full is not None:
        print(f"correlations with {n} resamples and {n} permutations: {full:6.2f} s")


if __name__ == "__main__":
    main()
