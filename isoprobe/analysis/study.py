"""Turn run directories into one tidy study table.

A run directory is what ``python run.py`` writes (``.hydra/config.yaml``, ``summary.json``,
``probe_metrics.csv``, ``rank_metrics.csv``, ``csv/metrics.csv``). :func:`find_runs` finds them
under the paths given (multirun directories, run directories, globs); :func:`load_study` reads
each into rows of ``run × probe × epoch × layer × metric`` with the run's factors (model, data
set, lengths, noise, task, seed and every override that varies across the runs) and its
forecast metrics (``before_test_nmse``, ``after_test_wql``, ...: ``summary.json``'s ``before``
and ``after`` with ``/`` written ``_``; ``final_*`` is the forecast the run ended with, ``after``
where it trained, else ``before``, present when a grid pools zero-shot and trained models).
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

log = logging.getLogger(__name__)
#: libyaml's safe loader where PyYAML was built with it (ten times the pure-Python one)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

PROBE_FILES = ("probe_metrics.csv", "rank_metrics.csv")
#: study column -> where it is in a run's resolved config
FACTORS = {
    "model": "model.name",
    "checkpoint": "model.checkpoint",
    "dataset": "data.dataset",
    "context_length": "data.context_length",
    "horizon": "data.prediction_length",
    "noise": "data.noise_std",
    "task": "task.name",
    "seed": "seed",
}
#: the probe settings that must agree for runs to be pooled (data set and model may differ)
PROBE_SETTING_PREFIXES = ("callbacks.",)
#: probe settings that change what is drawn, not what is measured
COSMETIC_SETTINGS = ("figures_every_n_epochs", "log_prefix", "_target_")


class AnalysisError(ValueError):
    """Runs that cannot be analysed as asked."""


@dataclass
class Study:
    """The study table and what was left out of it."""

    table: pd.DataFrame
    runs: pd.DataFrame
    forecast_metrics: list[str]
    validation: pd.DataFrame
    left_out: dict[str, str] = field(default_factory=dict)
    probe_settings: dict[str, Any] = field(default_factory=dict)


def find_runs(paths: Sequence[str]) -> list[Path]:
    """Every run directory under ``paths`` (each a run, a multirun directory, or a glob), in
    a stable order; analysis runs are skipped."""
    if isinstance(paths, str):
        paths = [paths]
    found: dict[Path, None] = {}
    for pattern in paths:
        for match in map(Path, sorted(glob.glob(str(Path(pattern).expanduser())))):
            if (match / ".hydra" / "config.yaml").is_file():
                found[match.resolve()] = None
            elif match.is_dir():
                for config in sorted(match.glob("**/.hydra/config.yaml")):
                    found[config.parent.parent.resolve()] = None
    runs = [run for run in found if _config(run).get("task", {}).get("name") != "analyze"]
    if not runs:
        raise AnalysisError(
            f"no runs found under analyze.runs={list(paths)}: a run directory holds "
            ".hydra/config.yaml (what python run.py writes). Looked in: "
            + ", ".join(str(Path(p).expanduser().resolve()) for p in paths)
        )
    return runs


def _config(run: Path) -> dict[str, Any]:
    return yaml.load((run / ".hydra" / "config.yaml").read_text(), Loader=SAFE_LOADER) or {}


def _select(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: json.dumps(node) if isinstance(node, list) else node}


def _overrides(run: Path) -> dict[str, str]:
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    items = yaml.load(path.read_text(), Loader=SAFE_LOADER) or []
    return dict(
        item.split("=", 1) for item in items if "=" in item and not item.startswith("hydra")
    )


def _forecast_metrics(run: Path) -> dict[str, float]:
    path = run / "summary.json"
    if not path.is_file():
        return {}
    summary = json.loads(path.read_text())
    metrics = {}
    for when in ("before", "after"):
        for name, value in (summary.get(when) or {}).items():
            if isinstance(value, (int, float)):
                metrics[f"{when}_{name.replace('/', '_')}"] = float(value)
    return metrics


def _domain(dataset: Any) -> str | None:
    from isoprobe.data import dataset_spec

    try:
        return dataset_spec(str(dataset)).domain
    except (KeyError, ValueError):
        return None


def _validation(run: Path, name: str) -> pd.DataFrame:
    """Per-epoch validation metrics a CSV logger wrote (``val/nmse`` -> ``val_nmse``)."""
    path = run / "csv" / "metrics.csv"
    if not path.is_file():
        return pd.DataFrame()
    frame = pd.read_csv(path)
    columns = [c for c in frame.columns if c.startswith("val/")]
    if "epoch" not in frame.columns or not columns:
        return pd.DataFrame()
    frame = frame[["epoch", *columns]].dropna(subset=columns, how="all")
    frame = frame.groupby("epoch", as_index=False).last()
    frame.columns = ["epoch", *(c.replace("/", "_") for c in columns)]
    frame.insert(0, "run", name)
    return frame


def _run_name(run: Path, root: Path) -> str:
    try:
        return str(run.relative_to(root)) or run.name
    except ValueError:
        return str(run)


def load_study(paths: Sequence[str], allow_mixed: bool = False) -> Study:
    """The study table of every run under ``paths`` (module docstring). Runs whose probe
    settings differ are refused unless ``allow_mixed``; runs without forecast metrics or
    probe records are left out and named in :attr:`Study.left_out`."""
    runs = find_runs(paths)
    root = Path(_common_root(runs))
    frames, rows, validation, left_out = [], [], [], {}
    settings: dict[str, dict[str, Any]] = {}
    overrides: dict[str, dict[str, str]] = {}
    for run in runs:
        name = _run_name(run, root)
        config = _config(run)
        records = [pd.read_csv(run / f) for f in PROBE_FILES if (run / f).is_file()]
        metrics = _forecast_metrics(run)
        if not records:
            left_out[name] = "no probe records (probe_metrics.csv / rank_metrics.csv)"
            continue
        if not metrics:
            left_out[name] = "no forecast metrics (summary.json without before/after)"
            continue
        factors = {column: _select(config, key) for column, key in FACTORS.items()}
        factors["domain"] = _domain(factors["dataset"])
        rows.append({"run": name, **factors, **metrics})
        settings[name] = _probe_settings(config)
        overrides[name] = _overrides(run)
        table = pd.concat(records, ignore_index=True)
        table.insert(0, "run", name)
        frames.append(table)
        validation.append(_validation(run, name))
    if not rows:
        raise AnalysisError(
            f"none of the {len(runs)} runs found has both probe records and forecast metrics: "
            + "; ".join(f"{k}: {v}" for k, v in left_out.items())
        )
    common = _check_probe_settings(settings, allow_mixed)
    run_table = pd.DataFrame(rows)
    swept = _varying_overrides(overrides, set(run_table.columns))
    for key, values in swept.items():
        run_table[key] = run_table["run"].map(values)
    add_final_forecast(run_table)
    forecast = sorted(c for c in run_table.columns if c.startswith(("before_", "after_", "final_")))
    records = pd.concat(frames, ignore_index=True)
    table = records.merge(run_table, on="run", how="left")
    val = pd.concat(validation, ignore_index=True) if any(len(v) for v in validation) else None
    if val is not None:
        table = table.merge(val, on=["run", "epoch"], how="left")
    return Study(
        table=table,
        runs=run_table,
        forecast_metrics=forecast,
        validation=val if val is not None else pd.DataFrame(),
        left_out=left_out,
        probe_settings=common,
    )


def add_final_forecast(runs: pd.DataFrame) -> None:
    """``final_<m>``: ``after_<m>`` where a run trained, else ``before_<m>``; added only when
    some runs trained and others did not (otherwise it repeats ``before_`` or ``after_`` and
    would only add tests to the table)."""
    for after in [c for c in runs.columns if c.startswith("after_")]:
        before = "before_" + after.removeprefix("after_")
        trained = runs[after].notna()
        if trained.any() and not trained.all() and before in runs:
            runs["final_" + after.removeprefix("after_")] = runs[after].fillna(runs[before])


def _common_root(runs: Iterable[Path]) -> str:
    paths = [str(r) for r in runs]
    return os.path.commonpath(paths) if len(paths) > 1 else str(Path(paths[0]).parent)


def _probe_settings(config: dict[str, Any]) -> dict[str, Any]:
    flat = _flatten(config)
    return {
        key: value
        for key, value in flat.items()
        if key.startswith(PROBE_SETTING_PREFIXES)
        and key.rsplit(".", 1)[-1] not in COSMETIC_SETTINGS
    }


def _check_probe_settings(settings: dict[str, dict[str, Any]], allow_mixed: bool) -> dict[str, Any]:
    """The probe settings every run shares; differing ones are refused unless allowed."""
    keys = sorted({key for s in settings.values() for key in s})
    differing = {key: sorted({json.dumps(s.get(key)) for s in settings.values()}) for key in keys}
    differing = {key: values for key, values in differing.items() if len(values) > 1}
    if differing and not allow_mixed:
        listed = "; ".join(f"{key}: {', '.join(values)}" for key, values in differing.items())
        raise AnalysisError(
            f"the runs were probed with different settings, so their geometry is not "
            f"comparable ({listed}). Analyse runs of one probe setting, or set "
            "analyze.allow_mixed=true to pool them anyway."
        )
    first = next(iter(settings.values()))
    return {key: value for key, value in first.items() if key not in differing}


def _varying_overrides(
    overrides: dict[str, dict[str, str]], taken: set[str]
) -> dict[str, dict[str, str]]:
    """Override keys (``data.noise_std``) whose values differ across runs -> run -> value."""
    keys = sorted({key for o in overrides.values() for key in o} - taken)
    varying = {}
    for key in keys:
        values = {run: o.get(key) for run, o in overrides.items()}
        if len(set(values.values())) > 1:
            varying[key] = values
    return varying
