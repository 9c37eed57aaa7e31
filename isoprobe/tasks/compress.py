"""``task=compress``: the model's attention projections by truncated SVD at each ε, evaluated side
by side with the original on the same test windows (the rank-structure paper's table 2).

For the original and for every ε (``compress.epsilon``: one value or a list): forecast metrics
from ``trainer.test`` (seeded identically, so sampled forecasts differ only by the model),
inference wall time of :meth:`forecast` over the first ``compress.timed_batches`` test batches
and their peak memory: the weights' bytes plus the most memory the forecasts added (CUDA's
allocator statistics on a GPU; on a CPU, which has none, the resident set,
:mod:`isoprobe.tasks.peak_memory`). The original is tested once; the compressed models are all
measured against one unchanged copy of it made the same way (:func:`paired_inference`): each
warmed up by one untimed forecast, then all in turn for ``compress.repeats`` rounds, so the
original is forecast once per round whatever the number of ε; an unchanged model reads 1 within
the machine's noise.
``compress.attention`` and ``compress.only_if_smaller`` choose which matrices are truncated and
whether a truncation that is not smaller is made (:mod:`isoprobe.models.compression`); every
setting is checked (:func:`compress_settings`) before the first forward pass.
Written to ``compression.csv`` and ``compression.md``, the trade-off to ``compression.png``; each
compressed model to ``compressed/eps<ε>/``, which ``model.checkpoint=<dir>`` loads back.
"""

from __future__ import annotations

import copy
import csv
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, ListConfig

from isoprobe.models.base import ForecastModule
from isoprobe.models.compression import (
    attention_sizes,
    check_attention_choice,
    compress_attention,
    depth_scaled_eps,
)
from isoprobe.models.compression_files import export_compressed
from isoprobe.probing.plots import save_compression_tradeoff
from isoprobe.tasks.peak_memory import cpu_peak_bytes, cpu_peak_supported, weight_bytes
from isoprobe.tasks.task import Task

COLUMNS = (
    "epsilon",
    "attention_size_ratio",
    "parameter_ratio",
    "wql_ratio",
    "mase_ratio",
    "nmse_ratio",
    "time_ratio",
    "memory_ratio",
    "factored",
    "truncated",
    "fused",
)
#: the projection statuses counted in the table (see ``ProjectionReport``)
STATUSES = ("factored", "truncated", "fused")


@dataclass(frozen=True)
class CompressSettings:
    """The ``compress`` config, checked (:func:`compress_settings`)."""

    epsilons: tuple[float, ...]
    early_factor: float
    timed_batches: int
    repeats: int
    save: bool
    attention: str
    only_if_smaller: bool


def _number(value: Any) -> float | None:
    """``value`` as a finite float; None for a string, a bool, NaN or anything not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def epsilons(setting: Any) -> list[float]:
    """``compress.epsilon``, one value or a list, as sorted floats in (0, 1)."""
    values = list(setting) if isinstance(setting, (list, tuple, ListConfig)) else [setting]
    numbers = [_number(v) for v in values]
    if not values or any(n is None or not 0 < n < 1 for n in numbers):
        raise ValueError(
            f"compress.epsilon must be a number in (0, 1) or a list of them, got {setting!r}; "
            "set e.g. compress.epsilon=0.01 or compress.epsilon=[0.01,0.1]"
        )
    return sorted(numbers)


def _positive_int(settings: Mapping, name: str) -> int:
    value = settings[name]
    number = _number(value)
    if number is None or number < 1 or number != int(number):
        raise ValueError(f"compress.{name} must be a whole number >= 1, got {value!r}")
    return int(number)


def _flag(settings: Mapping, name: str) -> bool:
    value = settings[name]
    if not isinstance(value, bool):
        raise ValueError(f"compress.{name} must be true or false, got {value!r}")
    return value


def compress_settings(settings: Mapping) -> CompressSettings:
    """The ``compress`` config with each option checked, so that a wrong value fails before any
    model runs; an error names the option and its valid values."""
    known = {f for f in CompressSettings.__dataclass_fields__ if f != "epsilons"} | {"epsilon"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown compress options {unknown}; known: {sorted(known)}")
    missing = sorted(known - set(settings))
    if missing:
        raise ValueError(f"compress options {missing} are not set (see configs/task/compress.yaml)")
    factor = _number(settings["early_factor"])
    if factor is None or factor <= 0:
        raise ValueError(
            "compress.early_factor must be a number > 0 (1: the same ε in every block; > 1 "
            f"truncates early blocks harder), got {settings['early_factor']!r}"
        )
    attention = settings["attention"]
    check_attention_choice(attention)
    return CompressSettings(
        epsilons=tuple(epsilons(settings["epsilon"])),
        early_factor=factor,
        timed_batches=_positive_int(settings, "timed_batches"),
        repeats=_positive_int(settings, "repeats"),
        save=_flag(settings, "save"),
        attention=attention,
        only_if_smaller=_flag(settings, "only_if_smaller"),
    )


def _forecast_seconds(model: ForecastModule, batches: list[dict], seed: int) -> float:
    torch.manual_seed(seed)
    cuda = model.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            model.forecast(batch)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def _memory_bytes(model: ForecastModule, batches: list[dict], seed: int) -> int:
    """Peak memory of forecasting ``batches``: the weights' bytes plus the most memory the
    forecasts added above what was in use before them (CUDA's allocator statistics on a GPU,
    the resident set on a CPU), so that other models in the same process do not count; the
    weights' bytes alone where a CPU cannot report a peak."""
    weights = weight_bytes(model)
    if model.device.type == "cuda":
        before = torch.cuda.memory_allocated(model.device)
        torch.cuda.reset_peak_memory_stats(model.device)
        _forecast_seconds(model, batches, seed)
        return weights + torch.cuda.max_memory_allocated(model.device) - before
    if not cpu_peak_supported():
        return weights
    return weights + cpu_peak_bytes(lambda: _forecast_seconds(model, batches, seed))


def _in_turn(
    measure: Callable[[ForecastModule], float], models: Sequence[ForecastModule], rounds: int
) -> list[list[float]]:
    """``rounds`` values of ``measure(model)`` for each model, the models taking turns and the
    order reversed every round (ABBA for two), so that none is always measured first or just
    after the same other."""
    values: list[list[float]] = [[] for _ in models]
    for round_ in range(rounds):
        order = range(len(models)) if round_ % 2 == 0 else reversed(range(len(models)))
        for i in order:
            values[i].append(measure(models[i]))
    return values


def timed_batches(datamodule, count: int, device: torch.device) -> list[dict]:
    """The first ``count`` test batches, on ``device``."""
    batches = []
    for batch in datamodule.test_dataloader():
        if len(batches) == count:
            break
        batches.append({key: value.to(device) for key, value in batch.items()})
    return batches


def paired_inference(
    reference: ForecastModule,
    compressed: Sequence[ForecastModule],
    batches: list[dict],
    repeats: int,
    seed: int,
) -> list[dict[str, float]]:
    """Forecasting time and peak memory of ``batches``, each compressed model over
    ``reference`` (an unchanged copy of the original, made as the compressed ones were, so that
    nothing but the compression tells them apart). Each model is warmed up by one untimed
    forecast, then all are measured in turn (:func:`_in_turn`) for ``repeats`` rounds: a time
    ratio is the median over rounds of the model's time over the reference's in the same round
    (a change of load on the machine falls on both), a memory ratio that of the least peaks."""
    models = (reference, *compressed)
    for model in models:
        model.eval()
        _forecast_seconds(model, batches, seed)
    times = _in_turn(lambda m: _forecast_seconds(m, batches, seed), models, repeats)
    memory = _in_turn(lambda m: _memory_bytes(m, batches, seed), models, repeats)
    return [
        {
            "time_ratio": statistics.median(
                after / before for before, after in zip(times[0], seconds, strict=True)
            ),
            "memory_ratio": min(peaks) / min(memory[0]),
        }
        for seconds, peaks in zip(times[1:], memory[1:], strict=True)
    ]


def _test_metrics(trainer: L.Trainer, model: ForecastModule, datamodule, seed: int) -> dict:
    """``trainer.test``'s forecast metrics, seeded so that two models' sampled forecasts differ
    only by the models."""
    L.seed_everything(seed, verbose=False)
    return trainer.test(model, datamodule=datamodule, verbose=False)[0]


def run_compress(
    cfg: DictConfig, trainer: L.Trainer, model: ForecastModule, datamodule
) -> dict[str, Any]:
    settings = compress_settings(cfg.compress)
    output_dir = Path(cfg.paths.output_dir)
    original = _test_metrics(trainer, model, datamodule, cfg.seed)
    parameters = sum(p.numel() for p in model.parameters())
    batches = timed_batches(datamodule, settings.timed_batches, model.device)
    reference = copy.deepcopy(model)
    rows, models = [], []
    for eps in settings.epsilons:
        compressed = copy.deepcopy(model)
        reports = compress_attention(
            compressed,
            depth_scaled_eps(compressed, eps, settings.early_factor),
            settings.attention,
            settings.only_if_smaller,
        )
        result = _test_metrics(trainer, compressed, datamodule, cfg.seed)
        before, after = attention_sizes(reports)
        rows.append(
            {
                "epsilon": eps,
                "attention_size_ratio": after / before,
                "parameter_ratio": sum(p.numel() for p in compressed.parameters()) / parameters,
                "wql_ratio": result["test/wql"] / original["test/wql"],
                "mase_ratio": result["test/mase"] / original["test/mase"],
                "nmse_ratio": result["test/nmse"] / original["test/nmse"],
                **{status: sum(r.status == status for r in reports) for status in STATUSES},
            }
        )
        if settings.save and trainer.is_global_zero:
            export_compressed(compressed, reports, str(output_dir / "compressed" / f"eps{eps:g}"))
        models.append(compressed)
    inference = paired_inference(reference, models, batches, settings.repeats, cfg.seed)
    rows = [{**row, **ratios} for row, ratios in zip(rows, inference, strict=True)]
    if trainer.is_global_zero:
        _write(output_dir, rows, "cuda" if model.device.type == "cuda" else "cpu", settings)
    return {"original": original, "compression": rows}


def _write(output_dir: Path, rows: list[dict], device: str, settings: CompressSettings) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    with (output_dir / "compression.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    memory = (
        "weights + the forecasts' peak CUDA memory above them"
        if device == "cuda"
        else "weights + the forecasts' peak resident memory above them (CPU)"
        if cpu_peak_supported()
        else "weights' bytes (CPU)"
    )
    matrices = "self- and cross-attention" if settings.attention == "all" else "self-attention"
    rule = "only where smaller" if settings.only_if_smaller else "whether or not smaller"
    lines = [
        f"ratios compressed / original on the same test windows; memory: {memory}",
        f"truncated: every {matrices} projection, {rule} (compress.attention="
        f"{settings.attention}, compress.only_if_smaller={str(settings.only_if_smaller).lower()})",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        cells = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    (output_dir / "compression.md").write_text("\n".join(lines) + "\n")
    save_compression_tradeoff(output_dir / "compression.png", rows)
    print("\n".join(lines))


def check_compress(cfg: DictConfig) -> None:
    """The ``compress`` settings, and a model without adapters, before data and weights load."""
    compress_settings(cfg.compress)
    if cfg.model.get("adapt", "full") == "lora":
        raise ValueError(
            "task=compress truncates the model's own attention projections, which "
            "model.adapt=lora would wrap in adapters: compress with model.adapt=full (a "
            "LoRA run's export, task=pretrain, holds its merged weights)"
        )


COMPRESS = Task("compress", trains=False, run=run_compress, check=check_compress)
