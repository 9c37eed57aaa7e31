"""Label-free model selection: does ranking candidates by a geometry metric, measured on
unlabelled windows, recover their ranking by forecast error?

A *selection task* is a set of candidates that a user would choose among: the models (runs) on
one data set, ranked by their test error, or one fine-tuning run's epochs, ranked by their
validation error. For each metric × layer choice (``last``, ``mean``) and each task:

- the direction: whether a larger value should mean a worse or a better candidate. It is not
  taken from the task's own errors (that would use the labels being predicted) but from the
  *other* tasks: the sign of the mean Spearman ρ between the metric and the error over them
  (leave one task out). With no other task there is no direction and no prediction;
- ``spearman``: Spearman's ρ between the predicted order (direction × value) and the true
  error: 1 when the metric orders the candidates exactly as their errors do;
- ``top1``: 1 when the candidate the metric predicts best has the lowest error.

Baselines in the same table: ``random`` (ρ 0 and top-1 1/k for k candidates, in expectation);
``best model elsewhere`` (among models on a data set: each candidate's model ranked by its mean
error rank on the *other* data sets, the choice a user makes without any geometry); and, where a
CSV logger wrote it, ``val_loss`` at the same epoch (a labelled baseline that needs no learned
direction: lower is predicted better). A geometry metric is worth something for selection only
where it beats ``best model elsewhere``. ``models_constant`` is the share of models (with two
runs or more) within which a metric takes one value (a measure of the weights of zero-shot
models, ``cka_drift`` of runs that did not train): at 1 it can only say which model a run is, and
near 1 mostly that (:func:`~.independence.constant_within_model`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoprobe.analysis.correlations import PAIRED_PROBE, geometry_at
from isoprobe.analysis.independence import constant_within_model
from isoprobe.analysis.study import Study, at_probe
from isoprobe.metrics import metrics_where

#: fewer candidates than this make no selection task
MIN_CANDIDATES = 3
SUMMARY_COLUMNS = (
    "selection",
    "probe",
    "metric",
    "layer",
    "tasks",
    "spearman",
    "top1",
    "models_constant",
)
#: the baseline that knows only how each model did on the other data sets
BEST_ELSEWHERE = "best model elsewhere"


def _rank_agreement(
    values: pd.DataFrame, error: pd.Series, task: pd.Series, learn_direction: bool
) -> pd.DataFrame:
    """Per task × column of ``values`` (candidates × predictors): the direction, ρ between the
    predicted order and ``error``, and top-1 agreement (module docstring)."""
    rho = {}
    for name, members in task.groupby(task).groups.items():
        if len(members) >= MIN_CANDIDATES:
            rho[name] = _spearman_where_defined(values.loc[members], error.loc[members])
    if not rho:
        return pd.DataFrame()
    rho = pd.DataFrame(rho).T  # tasks × predictors
    rows = []
    for name in rho.index:
        if learn_direction:
            direction = np.sign(rho.drop(index=name).mean(skipna=True))
        else:
            direction = pd.Series(1.0, index=rho.columns)
        direction = direction.replace(0.0, np.nan)  # the other tasks disagree: no prediction
        members = task.index[task == name]
        predicted = values.loc[members] * direction
        truth_best = error.loc[members].idxmin()
        for column in rho.columns:
            chosen = predicted[column].dropna()
            rows.append(
                {
                    "task": name,
                    "predictor": column,
                    "candidates": len(members),
                    "direction": direction[column],
                    "spearman": rho.at[name, column] * direction[column],
                    "top1": float(chosen.idxmin() == truth_best) if len(chosen) else np.nan,
                }
            )
    return pd.DataFrame(rows)


def _spearman_where_defined(values: pd.DataFrame, error: pd.Series) -> pd.Series:
    """Spearman's ρ of each column of ``values`` with ``error`` over the candidates both have;
    NaN, computed not at all, where either is constant there (ρ is undefined)."""
    rho = pd.Series(np.nan, index=values.columns)
    for column in values.columns:
        pair = pd.concat([values[column], error], axis=1).dropna()
        if len(pair) >= MIN_CANDIDATES and (pair.nunique() > 1).all():
            rho[column] = pair.iloc[:, 0].rank().corr(pair.iloc[:, 1].rank())
    return rho


def _summarise(agreement: pd.DataFrame, selection: str, random: bool = True) -> pd.DataFrame:
    """Per predictor over the tasks: how many, the mean ρ and the top-1 rate; with the random
    baseline's expectations (ρ 0, top-1 the mean of 1/k) when ``random``."""
    if agreement.empty or agreement["spearman"].isna().all():
        # no task had another to learn a direction from: nothing was predicted
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    grouped = agreement.dropna(subset=["spearman"]).groupby("predictor")
    summary = grouped.agg(
        tasks=("task", "nunique"), spearman=("spearman", "mean"), top1=("top1", "mean")
    ).reset_index()
    keys = pd.DataFrame(summary.pop("predictor").tolist(), columns=["probe", "metric", "layer"])
    summary = pd.concat([keys, summary], axis=1)
    if random:
        tasks = agreement.drop_duplicates("task")
        expected = {
            "probe": "baseline",
            "metric": "random",
            "layer": "",
            "tasks": len(tasks),
            "spearman": 0.0,
            "top1": float((1.0 / tasks["candidates"]).mean()),
        }
        summary = pd.concat([summary, pd.DataFrame([expected])], ignore_index=True)
    summary.insert(0, "selection", selection)
    if "models_constant" not in summary:
        summary["models_constant"] = np.nan
    return summary[list(SUMMARY_COLUMNS)]


def _geometry_predictors(wide: pd.DataFrame) -> pd.DataFrame:
    keep = [c for c in wide.columns if c[2] in ("last", "mean")]
    return wide[keep]


def models_on_a_data_set(study: Study, forecast: str) -> pd.DataFrame:
    """Selection among the runs on each data set, by their ``forecast`` error."""
    runs = study.runs.set_index("run")
    geometry = _geometry_predictors(geometry_at(study, PAIRED_PROBE[forecast.split("_", 1)[0]]))
    members = geometry.index[runs.loc[geometry.index, forecast].notna()]
    if len(members) < MIN_CANDIDATES:
        return _summarise(pd.DataFrame(), "models on a data set")
    error = runs.loc[members, forecast]
    task = runs.loc[members, "dataset"].astype(str)
    selection = f"models on a data set, by {forecast}"
    found = _summarise(_rank_agreement(geometry.loc[members], error, task, True), selection)
    flags = constant_within_model(geometry.loc[members], runs.loc[members, "model"].astype(str))
    keys = list(zip(found["probe"], found["metric"], found["layer"], strict=True))
    found["models_constant"] = [flags.get(key, np.nan) for key in keys]
    parts = [found]
    elsewhere = _best_model_elsewhere(runs.loc[members, "model"].astype(str), error, task)
    if elsewhere is not None:
        baseline = _rank_agreement(elsewhere, error, task, learn_direction=False)
        parts.append(_summarise(baseline, selection, random=False))
    validation = _validation_at(study, forecast, members)
    if validation is not None:
        baseline = _rank_agreement(validation, error, task, learn_direction=False)
        parts.append(_summarise(baseline, selection, random=False))
    return _ordered(pd.concat(parts, ignore_index=True))


def _best_model_elsewhere(
    models: pd.Series, error: pd.Series, task: pd.Series
) -> pd.DataFrame | None:
    """Per candidate: its model's mean error rank (0 best, 1 worst, among each task's
    candidates) over the tasks other than its own; NaN where its model ran on no other task.
    Lower is predicted better. None where no candidate has a value."""
    placed = error.groupby(task).rank(pct=True)
    values = pd.Series(np.nan, index=error.index)
    for name in task.unique():
        others = task != name
        mean_rank = placed[others].groupby(models[others]).mean()
        here = task.index[task == name]
        values.loc[here] = models.loc[here].map(mean_rank).to_numpy(dtype=float)
    if values.isna().all():
        return None
    return pd.DataFrame({("baseline", BEST_ELSEWHERE, ""): values})


def _ordered(summary: pd.DataFrame) -> pd.DataFrame:
    return summary.sort_values("spearman", ascending=False).reset_index(drop=True)


def _validation_at(study: Study, forecast: str, members: pd.Index) -> pd.DataFrame | None:
    """``val_loss`` of each run on the weights its geometry was measured on (the validation at
    the step of its first or last probe), where logged: none before training."""
    if "val_loss" not in study.table:
        return None
    when = PAIRED_PROBE[forecast.split("_", 1)[0]]
    rows = at_probe(study.table, when).dropna(subset=["val_loss"])
    at = rows.groupby("run")["val_loss"].first().reindex(members)
    if at.isna().all():
        return None
    return pd.DataFrame({("baseline", "val_loss", ""): at})


def epochs_of_a_run(study: Study, validation_metric: str = "val_nmse") -> pd.DataFrame:
    """Selection among each fine-tuning run's probed epochs, by ``validation_metric``."""
    table = study.table
    if validation_metric not in table:
        return _summarise(pd.DataFrame(), "epochs of a run")
    table = table[~table["metric"].isin(metrics_where("bookkeeping"))].dropna(
        subset=[validation_metric]
    )
    per_epoch = []
    for epoch, part in table.groupby("epoch"):
        snapshot = Study(part, study.runs, study.forecast_metrics, pd.DataFrame())
        wide = _geometry_predictors(geometry_at(snapshot, "before"))
        wide.index = pd.MultiIndex.from_arrays([wide.index, [epoch] * len(wide)])
        per_epoch.append(wide)
    if not per_epoch:
        return _summarise(pd.DataFrame(), "epochs of a run")
    values = pd.concat(per_epoch).sort_index()
    error = table.groupby(["run", "epoch"])[validation_metric].first().reindex(values.index)
    candidates = pd.Series(values.index.get_level_values(0), index=values.index)
    found = _rank_agreement(values, error, candidates, learn_direction=True)
    return _ordered(_summarise(found, f"epochs of a run, by {validation_metric}"))
