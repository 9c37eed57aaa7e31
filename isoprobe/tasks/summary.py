"""The short table a run ends with: probe metrics per layer (first vs last probe) and forecast
metrics before vs after training."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from isoprobe.metrics import metrics_where

FORECAST_METRICS = ("nmse", "mase", "wql")


def probe_summary(
    records: Iterable[Mapping], metrics: tuple[str, ...] | None = None
) -> dict[str, dict[str, tuple[float, float]]]:
    """layer -> metric -> (value at the first probe, value at the last), by step, for
    ``metrics`` (default: those registered with ``MetricInfo(summary=True)``)."""
    metrics = metrics_where("summary") if metrics is None else metrics
    by_key: dict[tuple[str, str], dict[int, float]] = {}
    for r in records:
        if r["metric"] in metrics:
            step = int(r["global_step"])
            by_key.setdefault((r["layer"], r["metric"]), {})[step] = float(r["value"])
    table: dict[str, dict[str, tuple[float, float]]] = {}
    for (layer, metric), values in by_key.items():
        first, last = min(values), max(values)
        table.setdefault(layer, {})[metric] = (values[first], values[last])
    return table


def probe_span(records: Iterable[Mapping]) -> str | None:
    """When the first and the last probe were: ``epoch 0 -> epoch 3``, or by step where a
    schedule in steps probed more than once in an epoch (``step 0 -> step 8``); one time where
    the run was probed once; None without records."""
    times = {(int(r["global_step"]), int(r["epoch"])) for r in records}
    if not times:
        return None
    (first_step, first_epoch), (last_step, last_epoch) = min(times), max(times)
    by_step = len({epoch for _, epoch in times}) < len(times)
    unit, first, last = (
        ("step", first_step, last_step) if by_step else ("epoch", first_epoch, last_epoch)
    )
    return f"{unit} {first}" if len(times) == 1 else f"{unit} {first} -> {unit} {last}"


def _fmt(value: float) -> str:
    return "nan" if value is None or math.isnan(value) else f"{value:.4g}"


def format_summary(
    records: list[Mapping],
    before: Mapping[str, float] | None,
    after: Mapping[str, float] | None,
    metrics: tuple[str, ...] | None = None,
) -> str:
    """A plain-text table (monospace) of :func:`probe_summary` ("first -> last", or one value
    when the run was probed once; ``metrics`` default: those registered with
    ``MetricInfo(summary=True)``) and of the forecast metrics that were measured."""
    metrics = metrics_where("summary") if metrics is None else metrics
    lines: list[str] = []
    span = probe_span(records)
    if span is not None:
        table = probe_summary(records, metrics)
        shown = [m for m in metrics if any(m in row for row in table.values())]
        single = "->" not in span
        lines.append(f"probe metrics per layer, {span}:")
        lines.append(f"{'layer':<12}" + "".join(f"{m:>26}" for m in shown))
        for layer in sorted(table, key=_layer_order):
            cells = []
            for m in shown:
                first, last = table[layer].get(m, (math.nan, math.nan))
                cell = _fmt(last) if single else f"{_fmt(first)} -> {_fmt(last)}"
                cells.append(f"{cell:>26}")
            lines.append(f"{layer:<12}" + "".join(cells))
    columns = {name: values for name, values in (("before", before), ("after", after)) if values}
    if columns:
        lines += ["", f"{'forecast (test)':<16}" + "".join(f"{name:>12}" for name in columns)]
        for m in FORECAST_METRICS:
            cells = "".join(f"{_fmt(v.get(f'test/{m}', math.nan)):>12}" for v in columns.values())
            lines.append(f"{m:<16}{cells}")
    return "\n".join(lines)


def _layer_order(name: str) -> tuple[int, str, int]:
    group, _, index = name.partition(".")
    rank = {"embed": 0, "encoder": 1, "decoder": 2}.get(group, 3)
    return rank, group, int(index) if index.isdigit() else -1
