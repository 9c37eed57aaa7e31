"""Associations that do not mix levels, and the exploration/confirmation split of
``task=analyze``.

- :func:`stratified_associations`: the within-stratum Spearman ρ
  (:func:`~isoprobe.analysis.statistics.stratified_spearman`) of every architecture-free
  geometry column (``embed``, the ``first``, ``middle`` and ``last`` block, the ``mean`` over
  blocks: strata of several models compare layers by depth) against every forecast metric,
  stratified by ``model`` and by ``dataset``. The rule of independence holds across strata: a
  measure of the weights alone over runs that share weights in any two strata is undefined
  (:mod:`.independence`). Families as in :mod:`.family`: repeats are counted once, a test whose
  strata are too small to reach the level is descriptive.
- :func:`confirm_findings`: the runs whose data set or seed ``analyze.confirm`` names are held
  out; the exploration runs' findings (q < 0.05 in the question or the scan) are each tested
  once on the held-out runs, and one *holds* where the held-out ρ has the exploration's sign and
  a Benjamini–Hochberg q < 0.05 over the findings tested. A finding the held-out runs cannot
  test (too few of them in its group, a constant side, shared weights) is kept as untested,
  with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd

from isoprobe.analysis.correlations import (
    ACROSS_MODELS,
    PAIRED_PROBE,
    correlations,
    forecast_order,
    geometry_at,
    groups,
    within_model_test,
)
from isoprobe.analysis.family import (
    ALPHA,
    WITHIN_MODEL,
    Question,
    assign_families,
    findings,
    log_pairings_of,
    sameness_key,
    smallest_p,
)
from isoprobe.analysis.independence import SHARED_WEIGHTS, shared_weight_tests
from isoprobe.analysis.statistics import MIN_RUNS, associate, q_values, stratified_spearman
from isoprobe.analysis.study import AnalysisError, Study

#: strata a stratified test can be taken in
STRATA = ("model", "dataset")
#: why a stratified test has no answer: no stratum of enough runs with both sides varying
NO_STRATUM = f"no stratum of {MIN_RUNS} runs that vary"


def stratified_associations(study: Study, n_perm: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Every architecture-free geometry column against every forecast metric, stratified by
    ``model`` and by ``dataset`` (columns ``probe, metric, layer, forecast_metric,
    stratified_by, n, spearman, p_value, q_value, family, repeats, undefined``; q over the
    table's exploratory tests)."""
    runs = study.runs.set_index("run")
    parts, keys = [], []
    for forecast in forecast_order(study.forecast_metrics):
        when = PAIRED_PROBE[forecast.split("_", 1)[0]]
        geometry = geometry_at(study, when)
        geometry = geometry.loc[:, geometry.columns.get_level_values(2).isin(ACROSS_MODELS)]
        rows = [r for r in geometry.index if np.isfinite(runs.at[r, forecast])]
        for factor in STRATA:
            if factor not in runs or not rows or geometry.empty:
                continue
            x = geometry.loc[rows].to_numpy(dtype=float)
            y = runs.loc[rows, forecast].to_numpy(dtype=float)
            strata = runs.loc[rows, factor].astype(str).to_numpy()
            found = stratified_spearman(x, y, strata, n_perm, seed)
            columns = geometry.columns
            metrics = columns.get_level_values(1)
            shared = shared_weight_tests(study, when, rows, metrics, x)
            undefined = np.where(found.n == 0, NO_STRATUM, None).astype(object)
            undefined[shared & (found.n > 0)] = SHARED_WEIGHTS
            defined = pd.isna(undefined)
            parts.append(
                pd.DataFrame(
                    {
                        "probe": columns.get_level_values(0),
                        "metric": metrics,
                        "layer": columns.get_level_values(2),
                        "forecast_metric": forecast,
                        "stratified_by": factor,
                        "n": found.n,
                        "spearman": np.where(defined, found.spearman, np.nan),
                        "p_value": np.where(defined, found.p_value, np.nan),
                        "log_pairings": found.log_pairings,
                        "undefined": undefined,
                    }
                )
            )
            keys += [sameness_key(rows, x[:, j], y, factor) for j in range(x.shape[1])]
    if not parts:
        return pd.DataFrame()
    table = pd.concat(parts, ignore_index=True)
    label = (table["forecast_metric"] + ", by " + table["stratified_by"]).tolist()
    primary = np.zeros(len(table), dtype=bool)
    table = assign_families(table, keys, primary, table["log_pairings"].to_numpy(), label)
    return table.drop(columns="log_pairings")


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


#: the columns of confirmation.csv
CONFIRMATION_COLUMNS = (
    "probe",
    "metric",
    "layer",
    "forecast_metric",
    "group",
    "family",
    "explore_n",
    "explore_spearman",
    "explore_q",
    "confirm_n",
    "confirm_spearman",
    "confirm_p",
    "confirm_q",
    "holds",
    "untested",
)
#: why a finding was not tested on the held-out runs
NO_HELD_OUT_GROUP = "no held-out run in its group"
HELD_OUT_TOO_FEW = "too few held-out runs to reach the level"


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """The confirmation table, and what the split left: the exploration's tests in the
    corrected families, and the groups whose held-out runs are too few to test anything."""

    table: pd.DataFrame
    explored: int
    small_groups: list[str]


def confirm_findings(
    study: Study,
    confirm: Sequence[str],
    n_perm: int = 1000,
    seed: int = 0,
    question: Question | None = None,
) -> Confirmation:
    """The exploration runs' findings (q < :data:`~.family.ALPHA` in the question or the scan)
    each tested once on the held-out runs (module docstring): one row per finding with its
    exploration and confirmation statistics, ``holds``, and why it was ``untested``."""
    explore, held = split_study(study, confirm)
    found = correlations(explore, n_boot=0, n_perm=n_perm, seed=seed, question=question)
    explored = int(found["family"].isin(["primary", "exploratory"]).sum())
    runs = held.runs.set_index("run")
    held_groups = groups(held)
    rows = []
    for finding in findings(found).itertuples(index=False):
        when = PAIRED_PROBE[finding.forecast_metric.split("_", 1)[0]]
        geometry = geometry_at(held, when)
        column = (finding.probe, finding.metric, finding.layer)
        members = [r for r in held_groups.get(finding.group, []) if r in geometry.index]
        n, rho, p, why = 0, np.nan, np.nan, NO_HELD_OUT_GROUP
        if finding.group == WITHIN_MODEL and question is not None:
            again = within_model_test(held, question, n_perm, seed)
            if again is not None:
                n, why = int(again["n"].iloc[0]), again["undefined"].iloc[0]
                if not why:
                    rho, p = float(again["spearman"].iloc[0]), float(again["p_value"].iloc[0])
        elif members and column in geometry.columns and finding.forecast_metric in runs:
            x = geometry.loc[members, [column]].to_numpy(dtype=float)
            y = runs.loc[members, finding.forecast_metric].to_numpy(dtype=float)
            result = associate(x, y[:, None], n_boot=0, n_perm=n_perm, seed=seed)
            n, why = int(result.n[0]), result.undefined[0]
            if not why and shared_weight_tests(held, when, members, [finding.metric], x)[0]:
                why = SHARED_WEIGHTS
            elif not why and smallest_p(log_pairings_of(n)) > ALPHA:
                why = HELD_OUT_TOO_FEW
            if not why:
                rho, p = float(result.spearman[0]), float(result.p_value[0])
        rows.append(
            {
                "probe": finding.probe,
                "metric": finding.metric,
                "layer": finding.layer,
                "forecast_metric": finding.forecast_metric,
                "group": finding.group,
                "family": finding.family,
                "explore_n": int(finding.n),
                "explore_spearman": float(finding.spearman),
                "explore_q": float(finding.q_value),
                "confirm_n": n,
                "confirm_spearman": rho,
                "confirm_p": p,
                "untested": why or None,
            }
        )
    table = pd.DataFrame(
        rows, columns=[c for c in CONFIRMATION_COLUMNS if c not in ("confirm_q", "holds")]
    )
    table["confirm_q"] = q_values(table["confirm_p"].to_numpy(dtype=float)) if len(table) else []
    same_sign = np.sign(table["confirm_spearman"]) == np.sign(table["explore_spearman"])
    table["holds"] = (same_sign & (table["confirm_q"] < ALPHA)).where(table["untested"].isna())
    small = sorted(
        group
        for group, members in held_groups.items()
        if smallest_p(log_pairings_of(len(members))) > ALPHA
    )
    return Confirmation(table[list(CONFIRMATION_COLUMNS)], explored, small)
