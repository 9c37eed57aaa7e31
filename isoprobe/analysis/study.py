"""Turn run directories into one tidy study table.

A run directory is what ``python run.py`` writes (``.hydra/config.yaml``, ``summary.json``,
``probe_metrics.csv``, ``rank_metrics.csv``, ``csv/metrics.csv``). :func:`find_runs` finds them
under the paths given (multirun directories, run directories, globs); :func:`load_study` reads
each into rows of ``run × probe × (epoch, global_step) × layer × metric`` (a run's probes are
ordered by ``global_step``: a schedule in steps probes several times per epoch) with the run's
factors (model, data set, lengths, noise, task, seed and every override that varies across the
runs) and its forecast metrics (``before_test_nmse``, ``after_test_wql``, ...:
``summary.json``'s ``before`` and ``after`` with ``/`` written ``_``; ``final_*`` is the forecast
the run ended with, ``after`` where it trained, else ``before``, present when a grid pools
zero-shot and trained models).

A run whose files cannot be read in full (:mod:`isoprobe.analysis.run_files` says which and
why) is left out with its reason, as is each job of a stopped sweep that never started
(:mod:`isoprobe.analysis.sweep_jobs`); the study goes on with the others. A path of
``analyze.runs`` that matches no run is named (:attr:`Study.unmatched`).
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

from isoprobe.analysis.run_files import (
    RECORD,
    Forecasts,
    UnreadableRun,
    read_config,
    read_csv,
    read_failure,
    read_overrides,
    read_probe_file,
    read_summary,
)
from isoprobe.analysis.sweep_jobs import never_started, sweeps_under
from isoprobe.errors import IsoprobeError

log = logging.getLogger(__name__)

PROBE_FILES = ("probe_metrics.csv", "rank_metrics.csv")
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
#: probe settings that change what is drawn or saved, not what is measured
COSMETIC_SETTINGS = ("figures_every_n_epochs", "log_prefix", "_target_", "save_window_means")


#: the column that orders a run's probes: the optimizer step (several probes may share an epoch)
PROBE_TIME = "global_step"


class AnalysisError(IsoprobeError, ValueError):
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
    #: runs kept in the study but left out of some tests -> why (a forecast metric that is not
    #: finite, or that the run lacks where it is the report's primary metric)
    partly_left_out: dict[str, str] = field(default_factory=dict)
    #: run -> its forecast columns whose value was not finite (kept as missing in :attr:`runs`)
    not_finite: dict[str, list[str]] = field(default_factory=dict)
    #: entries of ``analyze.runs`` that matched no run directory
    unmatched: list[str] = field(default_factory=list)
    #: every run's ``compression.csv`` rows with the run's factors (empty when none)
    compression: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: left-out run -> its directory (where its files, or the job that never started, are)
    left_out_dirs: dict[str, Path] = field(default_factory=dict)
    #: run -> its directory (where the files the table does not hold are, such as the saved
    #: window means of :mod:`isoprobe.analysis.model_similarity`)
    paths: dict[str, Path] = field(default_factory=dict)
    #: the wide geometry tables already pivoted from :attr:`table` (``correlations.geometry_at``
    #: keys them by epoch choice), so that the correlations, figures and tables share them
    pivots: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)


def find_runs(paths: Sequence[str]) -> list[Path]:
    """Every readable run directory under ``paths`` (each a run, a multirun directory, or a
    glob), in a stable order; analysis runs are skipped."""
    return list(_find(paths).runs)


@dataclass
class _Found:
    """What ``analyze.runs`` matched: readable runs with their configs, run directories left
    out (unreadable config, job never started) -> why, and the paths that matched no run."""

    runs: dict[Path, dict[str, Any]]
    left_out: dict[Path, str]
    unmatched: list[str]


def _find(paths: Sequence[str]) -> _Found:
    """The runs under ``paths`` with their resolved configs, read once."""
    if isinstance(paths, str):
        paths = [paths]
    runs: dict[Path, dict[str, Any]] = {}
    left_out: dict[Path, str] = {}
    unmatched = []
    for pattern in paths:
        found = _run_dirs(str(pattern))
        sweeps = [
            sweep.resolve()
            for match in map(Path, sorted(glob.glob(str(Path(pattern).expanduser()))))
            for sweep in sweeps_under(match)
        ]
        for run in found:
            failure = read_failure(run)
            if failure is not None:
                left_out[run] = f"failed: {failure}"
                continue
            try:
                config = read_config(run)
            except UnreadableRun as err:
                left_out[run] = str(err)
                continue
            if (config.get("task") or {}).get("name") != "analyze":
                runs[run] = config
        for sweep in sweeps:
            left_out.update(never_started(sweep))
        if not found and not sweeps:
            unmatched.append(str(pattern))
    if not runs:
        why = "; ".join(f"{run}: {reason}" for run, reason in left_out.items())
        raise AnalysisError(
            f"no runs found under analyze.runs={list(paths)}: a run directory holds "
            ".hydra/config.yaml (what python run.py writes). Looked in: "
            + ", ".join(str(Path(p).expanduser().resolve()) for p in paths)
            + (f". Left out: {why}" if why else "")
        )
    for pattern in unmatched:
        log.warning(
            "analyze.runs: %s matches no run directory (looked in %s)",
            pattern,
            Path(pattern).expanduser().resolve(),
        )
    return _Found(runs, left_out, unmatched)


def _run_dirs(pattern: str) -> list[Path]:
    """The run directories (those holding ``.hydra/config.yaml``) a path or glob matches."""
    found: dict[Path, None] = {}
    for match in map(Path, sorted(glob.glob(str(Path(pattern).expanduser())))):
        if (match / ".hydra" / "config.yaml").is_file():
            found[match.resolve()] = None
        elif match.is_dir():
            for config in sorted(match.glob("**/.hydra/config.yaml")):
                found[config.parent.parent.resolve()] = None
    return list(found)


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


def _domain(dataset: Any) -> str | None:
    from isoprobe.data import dataset_spec

    try:
        return dataset_spec(str(dataset)).domain
    except (KeyError, ValueError):
        return None


def _validation(run: Path, name: str) -> pd.DataFrame | None:
    """The validation metrics a CSV logger wrote (``val/nmse`` -> ``val_nmse``), one row per
    validation with its ``epoch`` and the ``global_step`` of the weights it measured. Lightning
    logs a validation at the index of the last training step it followed, ``global_step - 1``
    (the validation after a first epoch of 32 steps is logged at step 31, the probe after that
    epoch at step 32), so the row is keyed by that step + 1, the probe's step."""
    path = run / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    frame = read_csv(path)
    columns = [c for c in frame.columns if c.startswith("val/")]
    if "step" not in frame.columns or not columns:
        return None
    frame = frame[["step", "epoch", *columns]].dropna(subset=columns, how="all")
    frame = frame.groupby("step", as_index=False).last()
    frame["step"] = frame["step"].astype("int64") + 1
    frame.columns = [PROBE_TIME, "epoch", *(c.replace("/", "_") for c in columns)]
    frame.insert(0, "run", name)
    return frame


def _run_name(run: Path, root: Path) -> str:
    try:
        return str(run.relative_to(root)) or run.name
    except ValueError:
        return str(run)


def load_study(paths: Sequence[str], allow_mixed: bool = False) -> Study:
    """The study table of every run under ``paths`` (module docstring). Runs whose probe
    settings differ are refused unless ``allow_mixed``; runs without forecast metrics, runs whose
    files cannot be read in full and jobs that never started are left out and named in
    :attr:`Study.left_out`; runs without probe records (pretraining, compression) are kept for
    the report's tables and named in :attr:`Study.unprobed`."""
    found = _find(paths)
    root = Path(_common_root([*found.runs, *found.left_out]))
    left_out = {_run_name(run, root): why for run, why in found.left_out.items()}
    where = {_run_name(run, root): run for run in found.left_out}
    read: list[_RunFiles] = []
    paths: dict[str, Path] = {}
    for run, config in found.runs.items():
        name = _run_name(run, root)
        paths[name] = run
        try:
            files = _read_run(run, name)
        except UnreadableRun as err:
            left_out[name] = str(err)
            continue
        forecasts = files.forecasts
        if not forecasts.metrics and not forecasts.not_finite and files.compression is None:
            left_out[name] = "no forecast metrics (summary.json without before/after)"
            continue
        files.config = config
        read.append(files)
    if not read:
        raise AnalysisError(
            f"none of the {len(found.runs) + len(found.left_out)} runs found can be analysed: "
            + "; ".join(f"{k}: {v}" for k, v in left_out.items())
        )
    rows, settings, overrides, partly = [], {}, {}, {}
    for files in read:
        factors = {column: _select(files.config, key) for column, key in FACTORS.items()}
        factors["domain"] = _domain(factors["dataset"])
        rows.append({"run": files.name, **factors, **files.forecasts.metrics})
        overrides[files.name] = files.overrides
        if files.forecasts.not_finite:
            partly[files.name] = _not_finite_reason(files.forecasts)
        if files.records:
            settings[files.name] = _probe_settings(files.config)
    common = _check_probe_settings(settings, allow_mixed) if settings else {}
    run_table = pd.DataFrame(rows)
    for column in {c for f in read for c in f.forecasts.not_finite} - set(run_table.columns):
        run_table[column] = np.nan
    swept = _varying_overrides(overrides, set(run_table.columns))
    for key, values in swept.items():
        run_table[key] = run_table["run"].map(values)
    add_final_forecast(run_table)
    not_finite = _keep_final_out_where_after_is_not_finite(run_table, read)
    forecast = sorted(c for c in run_table.columns if c.startswith(_FORECAST))
    records = [(f.name, table) for f in read for table in f.records]
    table = _read_records(records).merge(run_table, on="run", how="left")
    validation = [f.validation for f in read if f.records and f.validation is not None]
    val = pd.concat(validation, ignore_index=True) if validation else None
    if val is not None:
        # a probe gets the validation of the very weights it measured: at the same step
        table = table.merge(val.drop(columns="epoch"), on=["run", PROBE_TIME], how="left")
    compression = [f.compression.assign(run=f.name) for f in read if f.compression is not None]
    return Study(
        table=table,
        runs=run_table,
        forecast_metrics=forecast,
        validation=val if val is not None else pd.DataFrame(),
        left_out=left_out,
        probe_settings=common,
        unprobed=[f.name for f in read if not f.records],
        partly_left_out=partly,
        not_finite=not_finite,
        unmatched=found.unmatched,
        compression=_with_factors(compression, run_table),
        paths={f.name: paths[f.name] for f in read},
        left_out_dirs={name: where.get(name) or paths[name] for name in left_out},
    )


@dataclass
class _RunFiles:
    """Everything the study takes from one run directory, read and checked."""

    name: str
    forecasts: Forecasts
    overrides: dict[str, str]
    records: list[pa.Table]
    validation: pd.DataFrame | None
    compression: pd.DataFrame | None
    config: dict[str, Any] = field(default_factory=dict)


def _read_run(run: Path, name: str) -> _RunFiles:
    """Every file of ``run`` the study uses; :class:`UnreadableRun` names the first that cannot
    be read in full."""
    forecasts = read_summary(run)
    records = [
        read_probe_file(run / f, forecasts.promised_rows.get(f))
        for f in PROBE_FILES
        if (run / f).is_file()
    ]
    compressed = run / COMPRESSION_FILE
    return _RunFiles(
        name=name,
        forecasts=forecasts,
        overrides=read_overrides(run),
        records=records,
        validation=_validation(run, name) if records else None,
        compression=read_csv(compressed) if compressed.is_file() else None,
    )


def _not_finite_reason(forecasts: Forecasts) -> str:
    listed = ", ".join(f"{k} = {v}" for k, v in forecasts.not_finite.items())
    return (
        f"summary.json has forecast metrics that are not finite ({listed}): the run is left "
        "out of the tests of those metrics"
    )


def _keep_final_out_where_after_is_not_finite(
    runs: pd.DataFrame, read: list[_RunFiles]
) -> dict[str, list[str]]:
    """A trained run whose ``after_<m>`` is not finite has no ``final_<m>`` either (not its
    ``before_<m>``, which :func:`add_final_forecast` takes for runs that did not train).
    Returns each run's forecast columns that are not finite, ``final_<m>`` included."""
    not_finite = {}
    for files in read:
        columns = list(files.forecasts.not_finite)
        for column in files.forecasts.not_finite:
            final = "final_" + column.removeprefix("after_")
            if column.startswith("after_") and final in runs:
                runs.loc[runs["run"] == files.name, final] = np.nan
                columns.append(final)
        if columns:
            not_finite[files.name] = columns
    return not_finite


def _read_records(tables: list[tuple[str, pa.Table]]) -> pd.DataFrame:
    """Every probe file's records (run name, checked table) as one frame with a leading ``run``
    column, joined once (a thousand runs in about a second)."""
    if not tables:
        return pd.DataFrame(columns=["run", *RECORD])
    frame = pa.concat_tables([t for _, t in tables], promote_options="permissive").to_pandas()
    names = np.repeat([name for name, _ in tables], [t.num_rows for _, t in tables])
    frame.insert(0, "run", names)
    return frame


def at_probe(table: pd.DataFrame, when: str) -> pd.DataFrame:
    """The rows of ``table`` at each run's first (``before``) or last (``after``) probe, by
    the step it was taken at."""
    if when not in ("before", "after"):
        raise ValueError(f"when must be 'before' or 'after', got {when!r}")
    steps = table.groupby("run")[PROBE_TIME].transform("min" if when == "before" else "max")
    return table[table[PROBE_TIME] == steps]


def probes_per_run(table: pd.DataFrame) -> pd.Series:
    """Run -> how many times it was probed (distinct steps)."""
    return table.groupby("run")[PROBE_TIME].nunique()


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
