"""One rule of independence for every test ``task=analyze`` makes.

A measure of the weights alone (the rank probe's ε-ranks of attention projections,
:func:`isoprobe.metrics.rank.is_weight_metric`) has one value per set of weights, whatever data
the run read. Runs that share their weights (one zero-shot model on several data sets, or
fine-tuning runs at their epoch-0 probe) are then one observation of it, not several: a test of
such a measure over runs among which two share weights is undefined (:data:`SHARED_WEIGHTS`),
whatever the table (across runs, stratified, confirmation, drift against gain) and however its
runs are split into strata. The same weights in twelve strata are still one observation.

:func:`weight_identity` names the weights each run's probe measured; :func:`shared_weight_tests`
says which tests of a table break the rule; :func:`constant_within_model` says in how many
models a predictor only says which model a run is (label-free selection reports it beside them).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoprobe.analysis.study import PROBE_TIME, Study
from isoprobe.metrics.rank import is_weight_metric

#: why a measure of the weights alone is not tested across these runs (module docstring)
SHARED_WEIGHTS = "runs share weights"
#: the checkpoint setting of randomly initialised weights (they differ by seed and shape)
SCRATCH = "scratch"


def weight_identity(study: Study, when: str) -> pd.Series:
    """Run -> a label of the weights its ``when`` probe (``before``: first, ``after``: last)
    measured: the run itself where that probe followed training (step > 0); else the weights
    it loaded, model and checkpoint, with the seed and window lengths for a random
    initialisation (``checkpoint=scratch``), whose weights they decide."""
    steps = study.table.groupby("run")[PROBE_TIME].agg("min" if when == "before" else "max")
    runs = study.runs.set_index("run").reindex(steps.index)
    factors = runs.reindex(columns=["model", "checkpoint", "seed", "context_length", "horizon"])
    factors = factors.astype(str)
    loaded = factors["model"] + "|" + factors["checkpoint"]
    scratch = factors["checkpoint"] == SCRATCH
    shape = factors[["seed", "context_length", "horizon"]].agg("|".join, axis=1)
    loaded = loaded.where(~scratch, loaded + "|" + shape)
    return loaded.where(steps == 0, "trained|" + runs.index.to_series())


def weight_columns(metrics: pd.Index | list[str]) -> np.ndarray:
    """Per metric name: whether it measures the weights alone."""
    return np.array([is_weight_metric(str(m)) for m in metrics], dtype=bool)


def sharing_weights(identity: pd.Series, x: np.ndarray) -> np.ndarray:
    """Per column of ``x`` [runs, tests] (rows in the order of ``identity``): whether two of the
    runs it is complete on share their weights (fewer distinct weight labels than runs)."""
    if not len(identity):
        return np.zeros(x.shape[1], dtype=bool)
    codes, _ = pd.factorize(identity)
    one_hot = np.eye(codes.max() + 1)[codes]  # runs × weight sets
    complete = np.isfinite(x)
    distinct = ((complete.T.astype(float) @ one_hot) > 0).sum(axis=1)
    return distinct < complete.sum(axis=0)


def shared_weight_tests(
    study: Study, when: str, rows: list[str], metrics: pd.Index | list[str], x: np.ndarray
) -> np.ndarray:
    """Per column of ``x`` [rows, tests] whose metric names are ``metrics``: whether the test
    measures the weights alone over runs (``rows``, all of them, every stratum together) among
    which two share weights at the ``when`` probe: such a test is undefined
    (:data:`SHARED_WEIGHTS`)."""
    identity = weight_identity(study, when).reindex(rows)
    return weight_columns(metrics) & sharing_weights(identity, x)


def constant_within_model(values: pd.DataFrame, models: pd.Series) -> pd.Series:
    """Per column of ``values`` (runs × predictors): the share of the models with two or more
    runs that have it within which it takes one value. 1: it says which model a run is and
    nothing about the run (the weight ranks of zero-shot models); a model trained anew on each
    data set (PatchTST from scratch beside zero-shot models) keeps the share below 1. NaN where
    no model has two runs with a value."""
    shares = {}
    for column in values.columns:
        present = values[column].dropna()
        per_model = present.groupby(models.reindex(present.index))
        repeated = per_model.size() > 1
        distinct = per_model.nunique()[repeated]
        shares[column] = float((distinct == 1).mean()) if repeated.any() else np.nan
    return pd.Series(shares, dtype=float)
