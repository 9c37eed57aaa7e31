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

import numpy as np
import pandas as pd
import pyarrow as pa
import yaml
from pyarrow import csv as pa_csv

log = logging.getLogger(__name__)
#: libyaml's safe loader where PyYAML was built with it (ten times the pure-Python one)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

PROBE_FILES = ("probe_metrics.csv", "rank_metrics.csv")
#: a probe record's columns (what the probe callbacks write)
RECORD = ("probe", "epoch", "global_step", "layer", "metric", "value", "note")
_FORECAST = ("before_", "after_", "final_")
#: what ``task=compress`` writes: one row per ε (the rank-structure paper's table 2)
COMPRESSION_FILE = "compression.csv"
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
    #: runs with forecast metrics but no probe records (pretraining, compression): in
    #: :attr:`runs` and the report's tables, not in the correlations
    unprobed: list[str] = field(default_factory=list)
    #: every run's ``compression.csv`` rows with the run's factors (empty when none)
    compression: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: the wide geometry tables already pivoted from :attr:`table` (``correlations.geometry_at``
    #: keys them by epoch choice), so that the correlations, figures and tables share them
    pivots: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)


def find_runs(paths: Sequence[str]) -> list[Path]:
    """Every run directory under ``paths`` (each a run, a multirun directory, or a glob), in
    a stable order; analysis runs are skipped."""
    return list(_runs_with_configs(paths))


def _runs_with_configs(paths: Sequence[str]) -> dict[Path, dict[str, Any]]:
    """:func:`find_runs` with each run's resolved config, read once."""
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
    configs = {run: _config(run) for run in found}
    runs = {run: c for run, c in configs.items() if c.get("task", {}).get("name") != "analyze"}
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
    pairs = (item.split("=", 1) for item in items if "=" in item)
    return {_override_name(key): value for key, value in pairs if not key.startswith("hydra")}


def _override_name(key: str) -> str:
    """The column an override is shown as: ``low_rank@model.low_rank`` -> ``low_rank``,
    ``+data.x`` -> ``data.x`` (the package and the add/force prefixes are not its name)."""
    return key.lstrip("+~").split("@", 1)[0]


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


def _validation(run: Path, name: str) -> pd.DataFrame | None:
    """Per-epoch validation metrics a CSV logger wrote (``val/nmse`` -> ``val_nmse``)."""
    path = run / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    frame = pd.read_csv(path)
    columns = [c for c in frame.columns if c.startswith("val/")]
    if "epoch" not in frame.columns or not columns:
        return None
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
    settings differ are refused unless ``allow_mixed``; runs without forecast metrics are left
    out and named in :attr:`Study.left_out`; runs without probe records (pretraining,
    compression) are kept for the report's tables and named in :attr:`Study.unprobed`."""
    runs = _runs_with_configs(paths)
    root = Path(_common_root(runs))
    probe_files, rows, validation, compression, left_out = [], [], [], [], {}
    unprobed = []
    settings: dict[str, dict[str, Any]] = {}
    overrides: dict[str, dict[str, str]] = {}
    for run, config in runs.items():
        name = _run_name(run, root)
        records = [(name, run / f) for f in PROBE_FILES if (run / f).is_file()]
        metrics = _forecast_metrics(run)
        compressed = run / COMPRESSION_FILE
        if not metrics and not compressed.is_file():
            left_out[name] = "no forecast metrics (summary.json without before/after)"
            continue
        factors = {column: _select(config, key) for column, key in FACTORS.items()}
        factors["domain"] = _domain(factors["dataset"])
        rows.append({"run": name, **factors, **metrics})
        overrides[name] = _overrides(run)
        if compressed.is_file():
            compression.append(pd.read_csv(compressed).assign(run=name))
        if not records:
            unprobed.append(name)
            continue
        settings[name] = _probe_settings(config)
        probe_files += records
        validation.append(_validation(run, name))
    if not rows:
        raise AnalysisError(
            f"none of the {len(runs)} runs found has forecast metrics: "
            + "; ".join(f"{k}: {v}" for k, v in left_out.items())
        )
    common = _check_probe_settings(settings, allow_mixed) if settings else {}
    run_table = pd.DataFrame(rows)
    swept = _varying_overrides(overrides, set(run_table.columns))
    for key, values in swept.items():
        run_table[key] = run_table["run"].map(values)
    add_final_forecast(run_table)
    forecast = sorted(c for c in run_table.columns if c.startswith(_FORECAST))
    table = _read_records(probe_files).merge(run_table, on="run", how="left")
    validation = [v for v in validation if v is not None]
    val = pd.concat(validation, ignore_index=True) if validation else None
    if val is not None:
        table = table.merge(val, on=["run", "epoch"], how="left")
    return Study(
        table=table,
        runs=run_table,
        forecast_metrics=forecast,
        validation=val if val is not None else pd.DataFrame(),
        left_out=left_out,
        probe_settings=common,
        unprobed=unprobed,
        compression=_with_factors(compression, run_table),
    )


def _read_records(files: list[tuple[str, Path]]) -> pd.DataFrame:
    """Every probe file (run name, path) as one frame with a leading ``run`` column, parsed by
    pyarrow's CSV reader and joined once (a thousand runs read in about a second)."""
    if not files:
        return pd.DataFrame(columns=["run", *RECORD])
    types = {"probe": pa.string(), "layer": pa.string(), "metric": pa.string(), "note": pa.string()}
    options = pa_csv.ConvertOptions(column_types=types, strings_can_be_null=True)
    tables = [pa_csv.read_csv(path, convert_options=options) for _, path in files]
    frame = pa.concat_tables(tables, promote_options="permissive").to_pandas()
    names = np.repeat([name for name, _ in files], [t.num_rows for t in tables])
    frame.insert(0, "run", names)
    return frame


def varying_factors(runs: pd.DataFrame, exclude: Sequence[str] = ()) -> list[str]:
    """The columns of a run table that are not the run, a forecast metric or in ``exclude``
    and whose values differ across the runs."""
    return [
        c
        for c in runs.columns
        if c != "run"
        and c not in exclude
        and not c.startswith(_FORECAST)
        and runs[c].astype(str).nunique() > 1
    ]


def _with_factors(parts: list[pd.DataFrame], runs: pd.DataFrame) -> pd.DataFrame:
    """Per-run rows (``compression.csv``) joined to the factors that tell the runs apart."""
    if not parts:
        return pd.DataFrame()
    varying = varying_factors(runs)
    keep = ["run", *[c for c in ("model", "dataset") if c not in varying], *varying]
    return runs[keep].merge(pd.concat(parts, ignore_index=True), on="run")


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
