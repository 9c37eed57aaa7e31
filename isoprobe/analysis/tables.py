"""The report's tables of runs that are compared by their forecasts alone: the same setting
over several seeds (low-rank pretraining, the rank-structure paper's table 3)."""

from __future__ import annotations

import pandas as pd

from isoprobe.analysis.study import Study

#: run-table columns that describe a run but are not a setting to compare
NOT_SETTINGS = ("run", "seed", "domain")


def forecast_by_setting(study: Study) -> pd.DataFrame:
    """Per setting (each combination of the factors that vary across the runs, seed aside):
    the number of runs and the mean and standard deviation over seeds of every forecast
    metric. Empty unless the runs differ in seed."""
    runs = study.runs
    if "seed" not in runs or runs["seed"].nunique() < 2:
        return pd.DataFrame()
    forecast = [c for c in study.forecast_metrics if runs[c].notna().any()]
    factors = [
        c
        for c in runs.columns
        if c not in NOT_SETTINGS
        and c not in study.forecast_metrics
        and runs[c].astype(str).nunique() > 1
    ]
    if not factors:
        factors = ["model"]
    grouped = runs.groupby(factors, dropna=False)
    table = grouped[forecast].agg(["mean", "std"])
    table.columns = [
        f"{metric}_{'sd' if stat == 'std' else stat}" for metric, stat in table.columns
    ]
    table.insert(0, "runs", grouped.size())
    return table.reset_index()
