"""Associations that do not mix levels, and the exploration/confirmation split of
``task=analyze``.

- :func:`stratified_spearman`: Spearman's ρ inside each stratum (a model, a data set, a run),
  combined as the mean weighted by the stratum's runs (van Elteren's idea for rank tests), with a
  permutation p-value that permutes the forecast inside each stratum only. Pooling runs of
  different models in one ρ mixes the between-model difference (one model is both more
  isotropic and better) with the within-model association the question is about; the
  stratified ρ keeps only the latter.
- :func:`stratified_associations`: that test for every geometry column of the across-run
  table, by ``model`` and by ``dataset``, beside the pooled figure of
  :func:`~isoprobe.analysis.correlations.correlations`.
- :func:`confirm_findings`: the runs whose data set or seed ``analyze.confirm`` names are held
  out; the exploration runs' table lists what they found (q < 0.05), each finding is tested
  once on the held-out runs, and it *holds* where the held-out ρ has the exploration's sign and
  a Benjamini–Hochberg q < 0.05 over the findings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from isoprobe.analysis.correlations import PAIRED_PROBE, correlations, geometry_at
from isoprobe.analysis.statistics import MIN_RUNS, associate, q_values
from isoprobe.analysis.study import AnalysisError, Study

#: the significance level of findings and of their confirmation
ALPHA = 0.05


def stratified_spearman(
    x: np.ndarray, y: np.ndarray, strata: np.ndarray, n_perm: int = 1000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ρ, p, n) per column of ``x`` [runs, tests] against ``y`` [runs]: the within-stratum
    Spearman ρ (``strata`` [runs] labels) averaged with weights n_s, over the strata where the
    test has at least :data:`MIN_RUNS` complete runs and neither side is constant; p from
    ``n_perm`` permutations of ``y`` inside each stratum (two-sided, (1 + hits) / (1 + n_perm));
    NaN where no stratum counts."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    strata = np.asarray(strata)
    tests = x.shape[1]
    rng = np.random.default_rng(seed)
    numerator, weight = np.zeros(tests), np.zeros(tests)
    permuted = np.zeros((n_perm, tests))
    for stratum in pd.unique(strata):
        rows = (strata == stratum) & np.isfinite(y)
        xs, ys = x[rows], y[rows]
        n = len(ys)
        usable = np.isfinite(xs).all(axis=0) & (n >= MIN_RUNS)
        if not usable.any():
            continue
        rx = _standard(stats.rankdata(xs[:, usable], axis=0))
        ry = _standard(stats.rankdata(ys)[:, None])[:, 0]
        defined = np.isfinite(rx).all(axis=0) & bool(np.isfinite(ry).all())
        columns = np.flatnonzero(usable)[defined]
        if not len(columns):
            continue
        rx = rx[:, defined]
        numerator[columns] += rx.T @ ry
        weight[columns] += n
        if n_perm:
            shuffled = ry[np.argsort(rng.random((n_perm, n)), axis=1)]
            permuted[:, columns] += shuffled @ rx
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(weight > 0, numerator / weight, np.nan)
        null = permuted / weight
    hits = (np.abs(null) >= np.abs(rho) - 1e-12).sum(axis=0)
    p = (
        np.where(weight > 0, (1 + hits) / (1 + n_perm), np.nan)
        if n_perm
        else np.full(tests, np.nan)
    )
    return rho, p, weight.astype(int)


def _standard(ranks: np.ndarray) -> np.ndarray:
    """Columns centred and scaled so that the mean product of two is their Pearson ρ (NaN for
    a constant column)."""
    centred = ranks - ranks.mean(axis=0)
    scale = np.sqrt((centred * centred).mean(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(scale > 0, centred / scale, np.nan)


def stratified_associations(study: Study, n_perm: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Every geometry column against every forecast metric, stratified by ``model`` and by
    ``dataset`` (columns ``probe, metric, layer, forecast_metric, stratified_by, n, spearman,
    p_value, q_value``; q over the table)."""
    runs = study.runs.set_index("run")
    parts = []
    for forecast in study.forecast_metrics:
        geometry = geometry_at(study, PAIRED_PROBE[forecast.split("_", 1)[0]])
        rows = [r for r in geometry.index if np.isfinite(runs.at[r, forecast])]
        for factor in ("model", "dataset"):
            if factor not in runs or not rows:
                continue
            rho, p, n = stratified_spearman(
                geometry.loc[rows].to_numpy(dtype=float),
                runs.loc[rows, forecast].to_numpy(dtype=float),
                runs.loc[rows, factor].astype(str).to_numpy(),
                n_perm,
                seed,
            )
            columns = geometry.columns
            parts.append(
                pd.DataFrame(
                    {
                        "probe": columns.get_level_values(0),
                        "metric": columns.get_level_values(1),
                        "layer": columns.get_level_values(2),
                        "forecast_metric": forecast,
                        "stratified_by": factor,
                        "n": n,
                        "spearman": rho,
                        "p_value": p,
                    }
                )
            )
    if not parts:
        return pd.DataFrame()
    table = pd.concat(parts, ignore_index=True)
    table["q_value"] = q_values(table["p_value"].to_numpy())
    return table


def split_study(study: Study, confirm: Sequence[str]) -> tuple[Study, Study]:
    """(exploration, confirmation): the runs whose data set or seed is one of ``confirm`` are
    the confirmation runs; both must be non-empty."""
    wanted = {str(value) for value in confirm}
    runs = study.runs
    held = pd.Series(False, index=runs.index)
    for factor in ("dataset", "seed"):
        if factor in runs:
            held |= runs[factor].astype(str).isin(wanted)
    if not held.any() or held.all():
        have = {f: sorted(map(str, runs[f].unique())) for f in ("dataset", "seed") if f in runs}
        raise AnalysisError(
            f"analyze.confirm={sorted(wanted)} holds out {int(held.sum())} of {len(runs)} runs; "
            f"name data sets or seeds that some runs, not all, have: {have}"
        )
    return _subset(study, runs.loc[~held, "run"]), _subset(study, runs.loc[held, "run"])


def _subset(study: Study, names: pd.Series) -> Study:
    keep = set(names)
    return dataclasses.replace(
        study,
        table=study.table[study.table["run"].isin(keep)],
        runs=study.runs[study.runs["run"].isin(keep)].reset_index(drop=True),
        validation=study.validation,
        pivots={},
    )


def _members(runs: pd.DataFrame, group: str) -> list[str]:
    if group == "all":
        return list(runs["run"])
    factor, _, value = group.partition("=")
    return list(runs.loc[runs[factor].astype(str) == value, "run"])


def confirm_findings(
    study: Study, confirm: Sequence[str], n_perm: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """The exploration runs' findings (q < :data:`ALPHA`) each tested once on the held-out runs
    (module docstring): one row per finding with its exploration and confirmation statistics
    and ``holds``."""
    explore, held = split_study(study, confirm)
    found = correlations(explore, n_boot=0, n_perm=n_perm, seed=seed)
    findings = found[found["q_value"] < ALPHA].reset_index(drop=True)
    runs = held.runs.set_index("run")
    rows = []
    for finding in findings.itertuples(index=False):
        when = PAIRED_PROBE[finding.forecast_metric.split("_", 1)[0]]
        geometry = geometry_at(held, when)
        column = (finding.probe, finding.metric, finding.layer)
        members = [r for r in _members(held.runs, finding.group) if r in geometry.index]
        rho = p = np.nan
        n = 0
        if column in geometry.columns and members and finding.forecast_metric in runs:
            x = geometry.loc[members, [column]].to_numpy(dtype=float)
            y = runs.loc[members, finding.forecast_metric].to_numpy(dtype=float)[:, None]
            result = associate(x, y, n_boot=0, n_perm=n_perm, seed=seed)
            n, rho, p = int(result.n[0]), float(result.spearman[0]), float(result.p_value[0])
        rows.append(
            {
                "probe": finding.probe,
                "metric": finding.metric,
                "layer": finding.layer,
                "forecast_metric": finding.forecast_metric,
                "group": finding.group,
                "explore_n": int(finding.n),
                "explore_spearman": float(finding.spearman),
                "explore_q": float(finding.q_value),
                "confirm_n": n,
                "confirm_spearman": rho,
                "confirm_p": p,
            }
        )
    table = pd.DataFrame(
        rows,
        columns=[
            "probe",
            "metric",
            "layer",
            "forecast_metric",
            "group",
            "explore_n",
            "explore_spearman",
            "explore_q",
            "confirm_n",
            "confirm_spearman",
            "confirm_p",
        ],
    )
    table["confirm_q"] = q_values(table["confirm_p"].to_numpy(dtype=float)) if len(table) else []
    same_sign = np.sign(table["confirm_spearman"]) == np.sign(table["explore_spearman"])
    table["holds"] = same_sign & (table["confirm_q"] < ALPHA)
    return table
