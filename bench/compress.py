"""Attention compression by truncated SVD: inference time and peak memory of the compressed
against the original model, side by side in one run (the rank-structure paper's section 5).

For each model (Chronos-T5, Chronos-Bolt) and each size:

- ``bundled`` (the trained checkpoint this project ships): the original and the model compressed
  at each ε of ``--eps``, with its WQL relative to the original on the energy test windows
  (seeded alike), so that the largest ε within 1% WQL can be read off;
- ``official`` (an official shape built from its config with random weights: the time and memory
  of a shape need no trained weights, accuracy does): every projection factored at fixed
  fractions of its full rank (``--rank-fractions``), since random weights have no decaying
  spectrum to threshold.

Every measurement runs in a fresh process (``spawn``): forecasting a fixed batch of ``--batch``
windows (context 512, horizon 64), best of ``--repeats``, and the process's peak resident memory
(``ru_maxrss``) less that of a process that only imported everything and built the original
model, i.e. the memory the forecasting itself took.

Run: ``.venv/bin/python bench/compress.py [--models chronos chronos_bolt]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from isoprobe.evaluation import ForecastMetrics
from isoprobe.models.compression import (
    attention_sizes,
    compress_attention,
    factor_at_rank_fraction,
)
from isoprobe.tasks.runner import build_model

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
OFFICIAL = {
    # amazon/chronos-t5-small's shape
    "chronos": [
        "model.scratch_t5.d_model=512",
        "model.scratch_t5.d_kv=64",
        "model.scratch_t5.num_heads=8",
        "model.scratch_t5.d_ff=2048",
        "model.scratch_t5.num_layers=6",
        "model.scratch_t5.num_decoder_layers=6",
    ],
    # amazon/chronos-bolt-small's shape
    "chronos_bolt": ["model.size=official_small"],
}
QUICK = {"chronos": ["model.num_samples=8"]}
CONTEXT, HORIZON = 512, 64


def _config(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=overrides)


def _model(name: str, size: str):
    overrides = [f"model={name}", *QUICK.get(name, [])]
    if size == "official":
        overrides += ["model.checkpoint=scratch", *OFFICIAL[name]]
    else:
        overrides.append("model.checkpoint=bundled")
    windows = SimpleNamespace(
        context_length=CONTEXT, prediction_length=HORIZON, season_length=1, freq="h"
    )
    torch.manual_seed(0)
    return build_model(_config(overrides).model, windows).eval()


def _batch(size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = torch.arange(CONTEXT + HORIZON, dtype=torch.float32)
    series = torch.sin(2 * torch.pi * t / 48 + torch.rand(size, 1, generator=g) * 6)
    series = series + 0.2 * torch.randn(size, CONTEXT + HORIZON, generator=g)
    return {
        "context": series[:, :CONTEXT],
        "target": series[:, CONTEXT:],
        "loc": torch.zeros(size),
        "scale": torch.ones(size),
    }


def _energy_wql(model) -> float:
    """WQL on the energy test windows (context 512, horizon 64), seeded."""
    data = _config(
        [
            "data=energy",
            f"data.context_length={CONTEXT}",
            f"data.prediction_length={HORIZON}",
            "data.max_eval_windows=64",
        ]
    ).data
    datamodule = instantiate(data)
    datamodule.prepare_data()
    datamodule.setup("test")
    metrics = ForecastMetrics(model.quantile_levels, datamodule.season_length)
    torch.manual_seed(0)
    with torch.no_grad():
        for batch in datamodule.test_dataloader():
            model._update_forecast_metrics(metrics, batch)
    return float(metrics.compute()["wql"])


def _measure(job: dict, queue) -> None:
    """One setting in this (fresh) process: ``original``, ``eps<ε>`` or ``fraction<f>``; with
    ``forecast`` false, only build the original (the memory baseline)."""
    torch.set_num_threads(job["threads"])
    model = _model(job["model"], job["size"])
    result: dict = {}
    setting = job["setting"]
    if setting.startswith("eps"):
        result["attention"] = attention_sizes(compress_attention(model, float(setting[3:])))
    elif setting.startswith("fraction"):
        result["attention"] = attention_sizes(factor_at_rank_fraction(model, float(setting[8:])))
    result["parameters"] = sum(p.numel() for p in model.parameters())
    if job["forecast"]:
        batch = _batch(job["batch"])
        result["seconds"] = float("inf")
        with torch.no_grad():
            for _ in range(job["repeats"]):
                torch.manual_seed(0)
                started = time.perf_counter()
                model.forecast(batch)
                result["seconds"] = min(result["seconds"], time.perf_counter() - started)
        if job["wql"]:
            result["wql"] = _energy_wql(model)
    result["rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put(result)


def measure(**job) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(job, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["chronos", "chronos_bolt"])
    parser.add_argument("--sizes", nargs="+", default=["bundled", "official"])
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.05, 0.1, 0.2, 0.3])
    parser.add_argument(
        "--rank-fractions", nargs="+", type=float, default=[0.5, 0.25, 0.125, 0.0625]
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    common = dict(batch=args.batch, repeats=args.repeats, threads=args.threads)
    for name in args.models:
        for size in args.sizes:
            bundled = size == "bundled"
            settings = (
                [f"eps{e:g}" for e in args.eps]
                if bundled
                else [f"fraction{f:g}" for f in args.rank_fractions]
            )
            base = measure(
                model=name, size=size, setting="original", forecast=False, wql=False, **common
            )
            original = measure(
                model=name, size=size, setting="original", forecast=True, wql=bundled, **common
            )
            print(
                f"\n{name}, {size} ({original['parameters'] / 1e6:.1f} M parameters): "
                f"forecast {original['seconds']:.2f} s for {args.batch} windows"
            )
            columns = ["attn size", "params", "time", "speed-up", "memory"]
            columns += ["WQL"] if bundled else []
            print(f"{'setting':<14}" + "".join(f"{c:>10}" for c in columns))
            own = max(1, original["rss_kb"] - base["rss_kb"])
            for setting in settings:
                r = measure(
                    model=name, size=size, setting=setting, forecast=True, wql=bundled, **common
                )
                before, after = r["attention"]
                cells = [
                    after / before,
                    r["parameters"] / original["parameters"],
                    r["seconds"] / original["seconds"],
                    original["seconds"] / r["seconds"],
                    max(1, r["rss_kb"] - base["rss_kb"]) / own,
                ]
                if bundled:
                    cells.append(r["wql"] / original["wql"])
                print(f"{setting:<14}" + "".join(f"{c:>10.3f}" for c in cells))
    print(
        "\nratios compressed / original (speed-up = original time / compressed time); memory: "
        "peak RSS of the forecasting process above the process that only built the original"
    )


if __name__ == "__main__":
    main()
