"""The report's tables that compare settings rather than correlate: the forecast of the same
setting over several seeds (low-rank pretraining, the rank-structure paper's table 3), and how
far training moved the geometry under each setting (adaptation strategies, regulariser
weights)."""

from __future__ import annotations

import pandas as pd

from isoprobe.analysis.correlations import geometry_at
from isoprobe.analysis.study import Study, probes_per_run, varying_factors

#: run-table columns that describe a run but are not a setting to compare
NOT_SETTINGS = ("seed", "domain")


def swept_settings(study: Study) -> list[str]:
    """The run-table columns that vary across the runs and describe a setting (not the run,
    its seed, its data set or a forecast metric). Over several data sets, a column with one
    value per data set follows from the data set rather than being swept (the ``data``
    override, a domain's own context length and horizon) and is left out, so that an
    adaptation sweep over domains compares its strategies, not its domains."""
    runs = study.runs
    settings = varying_factors(runs, (*NOT_SETTINGS, "dataset", "model"))
    if "dataset" not in runs or runs["dataset"].nunique() < 2:
        return settings
    as_text = runs[settings].astype(str).groupby(runs["dataset"].astype(str))
    return [c for c in settings if as_text[c].nunique().max() > 1]


def geometry_change(study: Study) -> pd.DataFrame:
    """Per swept setting (:func:`swept_settings`, else the model) × probe × metric: over the
    runs probed more than once, the mean change of the last block's value from the
    first probe to the last, and the mean absolute change (which setting's geometry
    moves most). Empty when no run was probed twice."""
    table = study.table
    if table.empty:
        return pd.DataFrame()
    probes = probes_per_run(table)
    trained = probes.index[probes > 1]
    if not len(trained):
        return pd.DataFrame()
    first, last = geometry_at(study, "before"), geometry_at(study, "after")
    keys = [c for c in first.columns if c[2] == "last"]
    change = last.loc[trained, keys] - first.loc[trained, keys]
    change.columns = [f"{probe}\t{metric}" for probe, metric, _ in keys]
    frame = change.rename_axis("run").reset_index().melt("run", value_name="change")
    frame[["probe", "metric"]] = frame.pop("variable").str.split("\t", expand=True)
    factors = swept_settings(study) or ["model"]
    frame = frame.merge(study.runs[["run", *factors]], on="run")
    grouped = frame.assign(abs_change=frame["change"].abs()).groupby([*factors, "probe", "metric"])
    result = grouped.agg(
        runs=("run", "nunique"),
        mean_change=("change", "mean"),
        mean_abs_change=("abs_change", "mean"),
    )
    return result.reset_index()


def forecast_by_setting(study: Study) -> pd.DataFrame:
    """Per setting (each combination of the factors that vary across the runs, seed aside):
    the number of runs and the mean and standard deviation over seeds of every forecast
    metric. Empty unless the runs differ in seed."""
    runs = study.runs
    if "seed" not in runs or runs["seed"].nunique() < 2:
        return pd.DataFrame()
    forecast = [c for c in study.forecast_metrics if runs[c].notna().any()]
    factors = varying_factors(runs, NOT_SETTINGS) or ["model"]
    grouped = runs.groupby(factors, dropna=False)
    table = grouped[forecast].agg(["mean", "std"])
    table.columns = [
        f"{metric}_{'sd' if stat == 'std' else stat}" for metric, stat in table.columns
    ]
    table.insert(0, "runs", grouped.size())
    return table.reset_index()
