"""Where in depth, and what changed: the readout and drift measures in ``task=analyze``.

- :func:`geometry_against_readout`: per-layer geometry against per-layer readout error
  (``readout_nmse``), one observation per run × layer at each run's last probe, the rank
  association taken inside each run (across its layers) and combined over runs
  (:func:`~isoprobe.analysis.stratified.stratified_spearman`): does a layer whose geometry is
  so-and-so hold more of the forecast, whatever the model?
- :func:`drift_against_gain`: each layer's drift from epoch 0 (``cka_drift`` at the last probe,
  with the ``last`` and ``mean`` layer choices) against the forecast gain of fine-tuning,
  1 - after / before of each forecast metric, across runs: pooled, and stratified by model.
  Several models are compared by depth (the ``first``, ``middle`` and ``last`` block, the
  ``mean``), under the rule of independence (:mod:`.independence`) and with families
  (:mod:`.family`: repeats counted once, too few runs descriptive, q over the rest).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoprobe.analysis.correlations import comparable_columns, geometry_at
from isoprobe.analysis.family import assign_families, log_pairings_of, sameness_key
from isoprobe.analysis.independence import SHARED_WEIGHTS, shared_weight_tests
from isoprobe.analysis.statistics import associate, q_values, stratified_spearman
from isoprobe.analysis.study import Study, at_probe
from isoprobe.metrics import metrics_where
from isoprobe.metrics.readout import READOUT_NMSE as READOUT
from isoprobe.metrics.similarity import CKA_DRIFT as DRIFT


def geometry_against_readout(study: Study, n_perm: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per geometry metric: runs, run × layer pairs, the within-run ρ with
    ``readout_nmse`` combined over runs, its permutation p and BH q (empty without readout); a
    measure of the weights alone over runs that share weights is undefined
    (:mod:`.independence`)."""
    table = study.table
    table = at_probe(table, "after")
    readout = table[table["metric"] == READOUT].set_index(["run", "layer"])["value"]
    if readout.empty:
        return pd.DataFrame()
    left_out = {*metrics_where("forecast"), *metrics_where("bookkeeping")}
    geometry = table[~table["metric"].isin(left_out)]
    wide = geometry.pivot_table(
        index=["run", "layer"], columns=["probe", "metric"], values="value", aggfunc="first"
    )
    wide = wide[wide.index.isin(readout.index)]
    if wide.empty:
        return pd.DataFrame()
    y = readout.reindex(wide.index).to_numpy(dtype=float)
    strata = wide.index.get_level_values("run").to_numpy()
    rho, p, n, _ = stratified_spearman(wide.to_numpy(dtype=float), y, strata, n_perm, seed)
    # each run is a stratum: a measure of the weights over runs (strata) that share weights
    # counts the same weights again in each of them (the rule of independence)
    per_run = wide.notna().groupby(level="run").any()
    metrics = wide.columns.get_level_values(1)
    present = np.where(per_run.to_numpy(), 1.0, np.nan)
    shared = shared_weight_tests(study, "after", list(per_run.index), metrics, present)
    out = pd.DataFrame(
        {
            "probe": wide.columns.get_level_values(0),
            "metric": metrics,
            "pairs": n,
            "runs": len(pd.unique(strata)),
            "spearman_within_run": np.where(shared, np.nan, rho),
            "p_value": np.where(shared, np.nan, p),
            "undefined": np.where(shared, SHARED_WEIGHTS, None),
        }
    )
    out["q_value"] = q_values(out["p_value"].to_numpy())
    return out


def drift_against_gain(study: Study, n_perm: int = 1000, seed: int = 0) -> pd.DataFrame:
    """One row per drift column (layer, ``last``, ``mean``) × forecast metric with a before and
    an after value: the pooled ρ with the gain 1 - after / before (and its p), and the ρ
    stratified by model (and its p); families and BH q over the exploratory tests
    (:func:`~isoprobe.analysis.family.assign_families`; empty without drift or training)."""
    geometry = geometry_at(study, "after")
    runs = study.runs.set_index("run")
    mixed = runs["model"].nunique() > 1
    geometry = comparable_columns(geometry, mixed)
    drift = [c for c in geometry.columns if c[1] == DRIFT and c[2] != "embed"]
    parts, keys = [], []
    for before in [f for f in study.forecast_metrics if f.startswith("before_")]:
        after = "after_" + before.removeprefix("before_")
        if not drift or after not in runs:
            continue
        gain = 1.0 - runs[after] / runs[before]
        rows = [r for r in geometry.index if np.isfinite(gain.get(r, np.nan))]
        if not rows:
            continue
        x = geometry.loc[rows, drift].to_numpy(dtype=float)
        y = gain.loc[rows].to_numpy(dtype=float)
        pooled = associate(x, y[:, None], n_boot=0, n_perm=n_perm, seed=seed)
        models = runs.loc[rows, "model"].astype(str).to_numpy()
        within = stratified_spearman(x, y, models, n_perm, seed)
        undefined = np.where(pooled.undefined == "", None, pooled.undefined).astype(object)
        shared = shared_weight_tests(study, "after", rows, [c[1] for c in drift], x)
        undefined[shared & pd.isna(undefined)] = SHARED_WEIGHTS
        defined = pd.isna(undefined)
        parts.append(
            pd.DataFrame(
                {
                    "layer": [c[2] for c in drift],
                    "forecast_gain": "gain_" + before.removeprefix("before_"),
                    "n": pooled.n,
                    "spearman": np.where(defined, pooled.spearman, np.nan),
                    "p_value": np.where(defined, pooled.p_value, np.nan),
                    "spearman_within_model": np.where(defined, within.spearman, np.nan),
                    "p_within_model": np.where(defined, within.p_value, np.nan),
                    "undefined": undefined,
                }
            )
        )
        keys += [sameness_key(rows, x[:, j], y) for j in range(x.shape[1])]
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    label = (out["forecast_gain"] + ", " + out["layer"]).tolist()
    primary = np.zeros(len(out), dtype=bool)
    return assign_families(out, keys, primary, log_pairings_of(out["n"].to_numpy()), label)
