"""Attention compression by truncated SVD: inference time and peak memory of the compressed
against the original model, side by side in one run (the rank-structure paper's section 5).

For each model (Chronos-T5, Chronos-Bolt) and each size:

- ``bundled`` (the trained checkpoint this project ships): the original and the model compressed
  at each ε of ``--eps`` (by default the paper's rule, as ``task=compress``: every self- and
  cross-attention matrix truncated, smaller or not; ``--attention self --only-if-smaller`` for
  the other), with its WQL relative to the original on the energy test windows (seeded alike),
  so that the largest ε within 1% WQL can be read off;
- ``official`` (an official shape built from its config with random weights: the time and memory
  of a shape need no trained weights, accuracy does): every projection factored at fixed
  fractions of its full rank (``--rank-fractions``), since random weights have no decaying
  spectrum to threshold.

Each table starts with a ``control`` row: an unchanged copy of the original, measured the same
way, whose ratios (1 up to the machine's noise) say how far apart two equal models read.

Every setting runs in a fresh process (``spawn``), forecasting a fixed batch (context 512,
horizon 64; ``--batch`` windows, by default 8 for Chronos-T5, whose sampled decoding is slow, and
64 for Chronos-Bolt). Memory is the forecast's peak: the weights' bytes plus the most resident
memory a forecast added above them (:mod:`isoprobe.tasks.peak_memory`). The original's own
time and memory (the fastest of at least ``--repeats`` forecasts and ``--min-seconds`` in all,
the least peak) head each table; every other row is measured in its process against an unchanged
copy of the original made there, as ``task=compress`` does: both warmed up, then in turn for
``--repeats`` rounds, time as the median of back-to-back ratios, memory as the ratio of the least
peaks. Measured across processes instead, an unchanged copy read 0.80 in memory. The
original's forecast is also timed inside its attention projections: with that share s of the
time, factoring them down to a fraction k of their weights cannot be faster than
1 / (1 - s (1 - k)) (the ``bound`` column).

Last, where factored layers stop paying: one projection [d, d], dense against two thin layers at
rank d/4 and d/8 (half and a quarter of its weights), for a range of d_model, on 64 rows (one
decoding step of 64 sample paths) and on 4096 (an encoder pass over 8 windows of 512).

Run: ``.venv/bin/python bench/compress.py [--models chronos chronos_bolt]``.
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing
import os
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from torch import nn

from isoprobe.evaluation import ForecastMetrics
from isoprobe.models.build import build_model
from isoprobe.models.compression import (
    ATTENTION_CHOICES,
    attention_matrices,
    attention_sizes,
    compress_attention,
    factor_at_rank_fraction,
    linear_owners,
)
from isoprobe.tasks.compress import paired_inference
from isoprobe.tasks.peak_memory import cpu_peak_bytes, weight_bytes

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
OFFICIAL = {
    # amazon/chronos-t5-small's shape
    "chronos": [
        "model.sizes.mini.d_model=512",
        "model.sizes.mini.d_kv=64",
        "model.sizes.mini.num_heads=8",
        "model.sizes.mini.d_ff=2048",
        "model.sizes.mini.num_layers=6",
        "model.sizes.mini.num_decoder_layers=6",
    ],
    # amazon/chronos-bolt-small's shape
    "chronos_bolt": ["model.size=official_small"],
}
QUICK = {"chronos": ["model.num_samples=8"]}
BATCH = {"chronos": 8, "chronos_bolt": 64}
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


def _attention_seconds(
    model, batch: dict[str, torch.Tensor], attention: str
) -> tuple[float, float]:
    """(seconds inside the attention projections that ``attention`` selects, seconds in all)
    of one seeded forecast."""
    owners = linear_owners(model)
    projections = [
        owners[id(weight)][1]
        for _, _, parts in attention_matrices(model, attention)
        for weight in parts.values()
        if id(weight) in owners
    ]
    inside, started = [0.0], [0.0]

    def enter(module, args):
        started[0] = time.perf_counter()

    def leave(module, args, output):
        inside[0] += time.perf_counter() - started[0]

    handles = [m.register_forward_pre_hook(enter) for m in projections]
    handles += [m.register_forward_hook(leave) for m in projections]
    torch.manual_seed(0)
    began = time.perf_counter()
    with torch.no_grad():
        model.forecast(batch)
    total = time.perf_counter() - began
    for handle in handles:
        handle.remove()
    return inside[0], total


def _measure(job: dict, queue) -> None:
    """One setting in this (fresh) process: ``original`` (its own time, memory and attention
    share), or ``control`` (an unchanged copy), ``eps<ε>``, ``fraction<f>``: that model against
    an unchanged copy of the original made in the same process, as ``task=compress`` measures
    them (:func:`isoprobe.tasks.compress.paired_inference`)."""
    torch.set_num_threads(job["threads"])
    model = _model(job["model"], job["size"])
    batch = _batch(job["batch"])
    setting = job["setting"]
    result: dict = {}
    if setting == "original":
        result.update(_alone(model, batch, job))
        result["attention_seconds"] = _attention_seconds(model, batch, job["attention"])
    else:
        reference = copy.deepcopy(model)
        if setting == "control":
            model = copy.deepcopy(model)
            result["attention"] = (1, 1)  # nothing truncated
        elif setting.startswith("eps"):
            reports = compress_attention(
                model, float(setting[3:]), job["attention"], job["only_if_smaller"]
            )
            result["attention"] = attention_sizes(reports)
        else:
            reports = factor_at_rank_fraction(model, float(setting[8:]), job["attention"])
            result["attention"] = attention_sizes(reports)
        result.update(paired_inference(reference, model, [batch], job["repeats"], seed=0))
    result["parameters"] = sum(p.numel() for p in model.parameters())
    if job["wql"]:
        result["wql"] = _energy_wql(model)
    queue.put(result)


def _alone(model, batch: dict[str, torch.Tensor], job: dict) -> dict[str, float]:
    """The fastest forecast of ``batch`` (at least ``repeats`` of them and ``min_seconds`` in
    all) and the weights plus the least peak resident memory a forecast added."""

    def forecast() -> None:
        torch.manual_seed(0)
        started = time.perf_counter()
        with torch.no_grad():
            model.forecast(batch)
        seconds.append(time.perf_counter() - started)

    seconds: list[float] = []
    peaks = []
    while len(seconds) < job["repeats"] or sum(seconds) < job["min_seconds"]:
        peaks.append(cpu_peak_bytes(forecast))
    return {"seconds": min(seconds), "memory": weight_bytes(model) + min(peaks)}


def measure(**job) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_measure, args=(job, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def layer_speedups(widths, token_counts, repeats: int) -> None:
    """Dense [d, d] against rank d/4 and d/8 factors, on each number of rows, for each d."""
    print("\none projection [d, d]: speed-up of the factored layer (rank d/4, d/8)")
    print(
        f"{'d_model':<10}"
        + "".join(f"{f'{n} tokens':>22}" for n in token_counts)
        + "\n"
        + " " * 10
        + f"{'dense ms  d/4   d/8':>22}" * len(token_counts)
    )
    for d in widths:
        cells = []
        for tokens in token_counts:
            x = torch.randn(tokens, d)
            layers = [nn.Linear(d, d, bias=False)]
            layers += [
                nn.Sequential(nn.Linear(d, d // f, bias=False), nn.Linear(d // f, d, bias=False))
                for f in (4, 8)
            ]
            best = []
            with torch.no_grad():
                for layer in layers:
                    layer(x)  # warm-up
                    seconds = float("inf")
                    for _ in range(repeats):
                        started = time.perf_counter()
                        layer(x)
                        seconds = min(seconds, time.perf_counter() - started)
                    best.append(seconds)
            cells.append(
                f"{best[0] * 1e3:>10.3f}" + "".join(f"{best[0] / b:>6.2f}" for b in best[1:])
            )
        print(f"{d:<10}" + "".join(f"{c:>22}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["chronos", "chronos_bolt"])
    parser.add_argument("--sizes", nargs="+", default=["bundled", "official"])
    parser.add_argument("--eps", nargs="+", type=float, default=[0.01, 0.05, 0.1, 0.2, 0.3])
    parser.add_argument("--rank-fractions", nargs="+", type=float, default=[0.25, 0.125, 0.0625])
    parser.add_argument(
        "--attention", choices=ATTENTION_CHOICES, default="all", help="as compress.attention"
    )
    parser.add_argument(
        "--only-if-smaller", action="store_true", help="as compress.only_if_smaller=true"
    )
    parser.add_argument("--batch", type=int, help="windows per forecast (default: per model)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--min-seconds", type=float, default=2.0, help="repeat a forecast at least this long"
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--widths", nargs="+", type=int, default=[64, 128, 256, 512, 1024, 2048])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    for name in args.models:
        common = dict(
            batch=args.batch or BATCH[name],
            repeats=args.repeats,
            min_seconds=args.min_seconds,
            threads=args.threads,
            attention=args.attention,
            only_if_smaller=args.only_if_smaller,
        )
        for size in args.sizes:
            bundled = size == "bundled"
            settings = ["control"] + (
                [f"eps{e:g}" for e in args.eps]
                if bundled
                else [f"fraction{f:g}" for f in args.rank_fractions]
            )
            original = measure(model=name, size=size, setting="original", wql=bundled, **common)
            inside, total = original["attention_seconds"]
            share = inside / total
            print(
                f"\n{name}, {size} ({original['parameters'] / 1e6:.1f} M parameters): forecast "
                f"{original['seconds']:.2f} s for {common['batch']} windows, "
                f"{original['memory'] / 2**20:.0f} MiB; attention projections {share:.0%} of it"
            )
            columns = ["attn size", "params", "time", "speed-up", "bound", "memory"]
            columns += ["WQL"] if bundled else []
            print(f"{'setting':<14}" + "".join(f"{c:>10}" for c in columns))
            for setting in settings:
                r = measure(model=name, size=size, setting=setting, wql=bundled, **common)
                before, after = r["attention"]
                kept = after / before
                cells = [
                    kept,
                    r["parameters"] / original["parameters"],
                    r["time_ratio"],
                    1 / r["time_ratio"],
                    1 / (1 - share * (1 - kept)),
                    r["memory_ratio"],
                ]
                if bundled:
                    cells.append(r["wql"] / original["wql"])
                print(f"{setting:<14}" + "".join(f"{c:>10.3f}" for c in cells))
    print(
        "\nratios compressed / original (speed-up = original time / compressed time; bound = the "
        "most that factoring the attention projections can give); memory: weights + the "
        "forecast's peak resident memory above them; control: an unchanged copy, measured alike "
        f"(attention={args.attention}, only_if_smaller={args.only_if_smaller})"
    )
    layer_speedups(args.widths, token_counts=(64, 4096), repeats=max(20, args.repeats))


if __name__ == "__main__":
    main()
