"""``task=compress``: the model's attention projections by truncated SVD at each ε, evaluated side
by side with the original on the same test windows (the rank-structure paper's table 2).

For the original and for every ε (``compress.epsilon``: one value or a list): forecast metrics
from ``trainer.test`` (seeded identically, so sampled forecasts differ only by the model),
inference wall time of :meth:`forecast` over the first ``compress.timed_batches`` test batches
(best of ``compress.repeats``, original and compressed alternating), and the peak memory of
those forecasts: CUDA's peak on a GPU; on a CPU, which has no allocator statistics, the weights'
bytes plus the most resident memory the forecasts added (:mod:`isoprobe.tasks.peak_memory`).
Written to ``compression.csv`` and ``compression.md``, the trade-off to ``compression.png``; each
compressed model to ``compressed/eps<ε>/``, which ``model.checkpoint=<dir>`` loads back.
"""

from __future__ import annotations

import copy
import csv
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, ListConfig

from isoprobe.callbacks.plots import save_compression_tradeoff
from isoprobe.models.base import ForecastModule
from isoprobe.models.compression import (
    attention_sizes,
    compress_attention,
    depth_scaled_eps,
    export_compressed,
)
from isoprobe.tasks.peak_memory import cpu_peak_bytes, cpu_peak_supported, weight_bytes

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
    "fused",
)


def epsilons(setting: Any) -> list[float]:
    values = list(setting) if isinstance(setting, (list, tuple, ListConfig)) else [setting]
    if not values or any(not 0 < float(v) < 1 for v in values):
        raise ValueError(f"compress.epsilon must be values in (0, 1), got {values}")
    return sorted(float(v) for v in values)


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
    """Peak memory of forecasting ``batches``: the peak CUDA memory on a GPU; on a CPU the
    weights' bytes plus the most resident memory the forecasts added above them (the weights'
    bytes alone where the system cannot report a peak)."""
    if model.device.type != "cuda":
        weights = weight_bytes(model)
        if not cpu_peak_supported():
            return weights
        return weights + cpu_peak_bytes(lambda: _forecast_seconds(model, batches, seed))
    torch.cuda.reset_peak_memory_stats(model.device)
    _forecast_seconds(model, batches, seed)
    return torch.cuda.max_memory_allocated(model.device)


def _paired_inference(
    original: ForecastModule, compressed: ForecastModule, datamodule, cfg: DictConfig
) -> dict[str, float]:
    """Forecasting time (best of ``compress.repeats``, the two models alternating so that other
    load on the machine falls on both) and memory of the first ``compress.timed_batches`` test
    batches, compressed over original."""
    batches = []
    for batch in datamodule.test_dataloader():
        if len(batches) == int(cfg.compress.timed_batches):
            break
        batches.append({key: value.to(original.device) for key, value in batch.items()})
    original.eval()
    compressed.eval()
    times = [float("inf"), float("inf")]
    for _ in range(int(cfg.compress.repeats)):
        for i, model in enumerate((original, compressed)):
            times[i] = min(times[i], _forecast_seconds(model, batches, cfg.seed))
    memory = [_memory_bytes(model, batches, cfg.seed) for model in (original, compressed)]
    return {"time_ratio": times[1] / times[0], "memory_ratio": memory[1] / memory[0]}


def _test_metrics(trainer: L.Trainer, model: ForecastModule, datamodule, seed: int) -> dict:
    """``trainer.test``'s forecast metrics, seeded so that two models' sampled forecasts differ
    only by the models."""
    L.seed_everything(seed, verbose=False)
    return trainer.test(model, datamodule=datamodule, verbose=False)[0]


def run_compress(
    cfg: DictConfig, trainer: L.Trainer, model: ForecastModule, datamodule
) -> dict[str, Any]:
    output_dir = Path(cfg.paths.output_dir)
    original = _test_metrics(trainer, model, datamodule, cfg.seed)
    parameters = sum(p.numel() for p in model.parameters())
    rows = []
    for eps in epsilons(cfg.compress.epsilon):
        compressed = copy.deepcopy(model)
        reports = compress_attention(
            compressed, depth_scaled_eps(compressed, eps, float(cfg.compress.early_factor))
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
                **_paired_inference(model, compressed, datamodule, cfg),
                "factored": sum(r.status == "factored" for r in reports),
                "fused": sum(r.status == "fused" for r in reports),
            }
        )
        if cfg.compress.save and trainer.is_global_zero:
            export_compressed(compressed, reports, str(output_dir / "compressed" / f"eps{eps:g}"))
        del compressed
    if trainer.is_global_zero:
        _write(output_dir, rows, "cuda" if model.device.type == "cuda" else "cpu")
    return {"original": original, "compression": rows}


def _write(output_dir: Path, rows: list[dict], device: str) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    with (output_dir / "compression.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    memory = (
        "peak CUDA memory"
        if device == "cuda"
        else "weights + the forecasts' peak resident memory above them (CPU)"
        if cpu_peak_supported()
        else "weights' bytes (CPU)"
    )
    lines = [
        f"ratios compressed / original on the same test windows; memory: {memory}",
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
