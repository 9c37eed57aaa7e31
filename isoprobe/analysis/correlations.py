"""Does the geometry predict the forecast error? Rank associations across runs and over epochs.

Across runs (``correlations.csv``): one observation per run, the geometry metric measured on
the same weights that made the forecast: ``before_*`` errors pair with the run's first probe
(zero-shot, or epoch 0 of a fine-tuning run), ``after_*`` and ``final_*`` errors with its last
(a zero-shot run has one probed epoch, so its last is its first). A test is one
metric × layer choice × forecast metric × group; the layer choices are every layer, ``last``
(the last block of each model, nearest its output: the papers' choice) and ``mean`` (the mean
over a model's blocks); the groups are ``all`` runs pooled, each ``model=<m>``, and each
``dataset=<d>`` that several models ran on. Benjamini–Hochberg q-values are taken over every
defined test of the table, since many metric × layer pairs are tested at once.

A test with no answer (``undefined`` says why: too few runs, a constant metric or forecast) has
no ρ, τ, interval, p or q and takes no place in the correction (:mod:`.statistics`). A measure
of the weights alone (the rank probe's ε-ranks of attention projections,
:func:`isoprobe.metrics.rank.is_weight_metric`) has one value per set of weights, whatever data
the run read: across runs that share their weights (one zero-shot model on several data sets,
or fine-tuning runs at their epoch-0 probe) its runs are not independent observations, so such a
test is undefined (``runs share weights``) unless every run it uses has weights of its own
(:func:`weight_identity`).

Within runs (``within_run.csv``): for fine-tuning runs with per-epoch validation metrics, each
metric's trajectory over epochs against the validation error, per run.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from isoprobe.analysis.statistics import MIN_RUNS, TOO_FEW_RUNS, associate, q_values
from isoprobe.analysis.study import Study
from isoprobe.metrics import metrics_where
from isoprobe.metrics.rank import is_weight_metric

CORRELATION_COLUMNS = (
    "metric",
    "layer",
    "forecast_metric",
    "group",
    "n",
    "spearman",
    "spearman_lo",
    "spearman_hi",
    "kendall",
    "p_value",
    "q_value",
    "undefined",
)
#: a block of a stack: ``encoder.3``, ``decoder.0``, ``blocks.11`` (not ``embed``, not sites)
BLOCK = re.compile(r"^[A-Za-z_]+\.\d+$")
#: forecast-metric prefix -> the probed epoch it pairs with (:func:`geometry_at`)
PAIRED_PROBE = {"before": "before", "after": "after", "final": "after"}
#: why a measure of the weights alone is not tested across runs (module docstring)
SHARED_WEIGHTS = "runs share weights"
#: the checkpoint setting of randomly initialised weights (they differ by seed and shape)
SCRATCH = "scratch"


def geometry_at(study: Study, when: str) -> pd.DataFrame:
    """Run × (probe, metric, layer) values at each run's first (``before``) or last
    (``after``) probed epoch, with the ``last`` and ``mean`` layer choices added; pivoted once
    per study and epoch choice (:attr:`Study.pivots`)."""
    if when not in ("before", "after"):
        raise ValueError(f"when must be 'before' or 'after', got {when!r}")
    if when not in study.pivots:
        study.pivots[when] = _pivot_geometry(study, when)
    return study.pivots[when]


def _pivot_geometry(study: Study, when: str) -> pd.DataFrame:
    table = study.table
    table = table[~table["metric"].isin(metrics_where("bookkeeping"))]
    epochs = table.groupby("run")["epoch"].transform("min" if when == "before" else "max")
    at = table[table["epoch"] == epochs]
    wide = at.pivot_table(
        index="run", columns=["probe", "metric", "layer"], values="value", aggfunc="first"
    )
    order = {layer: i for i, layer in enumerate(pd.unique(table["layer"]))}
    layers = pd.Series(pd.unique(at["layer"]))
    block_names = set(layers[layers.astype(str).str.fullmatch(BLOCK.pattern)])
    blocks = at[at["layer"].isin(block_names)]
    if len(blocks):
        rank = blocks["layer"].map(order)
        last_rank = rank.groupby([blocks["run"], blocks["probe"]]).transform("max")
        last = blocks[rank == last_rank].pivot_table(
            index="run", columns=["probe", "metric"], values="value", aggfunc="first"
        )
        # the mean over a run's blocks is NaN where one of them is (not the others' mean)
        values = blocks.groupby(["run", "probe", "metric"])["value"]
        mean = values.mean().where(values.count() == values.size())
        mean = mean.unstack(["probe", "metric"]).dropna(axis=1, how="all")
        extra = [_with_layer(last, "last"), _with_layer(mean, "mean")]
        wide = pd.concat([wide, *extra], axis=1)
    return wide.sort_index(axis=1)


def _with_layer(frame: pd.DataFrame, layer: str) -> pd.DataFrame:
    frame = frame.copy()
    frame.columns = pd.MultiIndex.from_tuples([(p, m, layer) for p, m in frame.columns])
    return frame


def weight_identity(study: Study, when: str) -> pd.Series:
    """Run -> a label of the weights its ``when`` probe (``before``: first, ``after``: last)
    measured: the run itself where that probe followed training (epoch > 0); else the weights
    it loaded, model and checkpoint, with the seed and window lengths for a random
    initialisation (``checkpoint=scratch``), whose weights they decide."""
    epochs = study.table.groupby("run")["epoch"].agg("min" if when == "before" else "max")
    runs = study.runs.set_index("run").reindex(epochs.index)
    factors = runs.reindex(columns=["model", "checkpoint", "seed", "context_length", "horizon"])
    factors = factors.astype(str)
    loaded = factors["model"] + "|" + factors["checkpoint"]
    scratch = factors["checkpoint"] == SCRATCH
    shape = factors[["seed", "context_length", "horizon"]].agg("|".join, axis=1)
    loaded = loaded.where(~scratch, loaded + "|" + shape)
    return loaded.where(epochs == 0, "trained|" + runs.index.to_series())


def _sharing_weights(identity: pd.Series, x: np.ndarray) -> np.ndarray:
    """Per column of ``x`` [runs, tests]: whether two of the runs it is complete on share
    their weights (fewer distinct weight labels than runs)."""
    codes, _ = pd.factorize(identity)
    one_hot = np.eye(codes.max() + 1)[codes]  # runs × weight sets
    complete = np.isfinite(x)
    distinct = ((complete.T.astype(float) @ one_hot) > 0).sum(axis=1)
    return distinct < complete.sum(axis=0)


def groups(study: Study) -> dict[str, list[str]]:
    """``all``; each ``model=<m>``; each ``dataset=<d>`` that more than one model ran on."""
    runs = study.runs
    found = {"all": list(runs["run"])}
    for model, part in runs.groupby("model", sort=True):
        found[f"model={model}"] = list(part["run"])
    for dataset, part in runs.groupby("dataset", sort=True):
        if part["model"].nunique() > 1:
            found[f"dataset={dataset}"] = list(part["run"])
    return found


def correlations(
    study: Study, n_boot: int = 1000, n_perm: int = 1000, seed: int = 0
) -> pd.DataFrame:
    """The across-run table of the module docstring (:data:`CORRELATION_COLUMNS` + ``probe``),
    one row per test, with BH q-values over the whole table."""
    runs = study.runs.set_index("run")
    wide = {when: geometry_at(study, when) for when in ("before", "after")}
    identity = {when: weight_identity(study, when) for when in ("before", "after")}
    weights = {
        when: np.array([is_weight_metric(m) for m in frame.columns.get_level_values(1)], bool)
        for when, frame in wide.items()
    }
    parts = []
    for forecast in study.forecast_metrics:
        when = PAIRED_PROBE[forecast.split("_", 1)[0]]
        geometry = wide[when]
        for group, members in groups(study).items():
            rows = [r for r in members if r in geometry.index and np.isfinite(runs.at[r, forecast])]
            if not rows:
                continue
            x = geometry.loc[rows].to_numpy(dtype=float)
            y = runs.loc[rows, forecast].to_numpy(dtype=float)[:, None]  # shared by every test
            found = associate(x, y, n_boot=n_boot, n_perm=n_perm, seed=seed)
            shared = weights[when] & _sharing_weights(identity[when].loc[rows], x)
            columns = geometry.columns
            part = pd.DataFrame(
                {
                    "probe": columns.get_level_values(0),
                    "metric": columns.get_level_values(1),
                    "layer": columns.get_level_values(2),
                    "forecast_metric": forecast,
                    "group": group,
                    "n": found.n,
                    "spearman": found.spearman,
                    "spearman_lo": found.spearman_lo,
                    "spearman_hi": found.spearman_hi,
                    "kendall": found.kendall,
                    "p_value": found.p_value,
                    "undefined": np.where(found.undefined == "", None, found.undefined),
                }
            )
            _undefine(part, shared & (found.undefined != TOO_FEW_RUNS), SHARED_WEIGHTS)
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=[*CORRELATION_COLUMNS, "probe"])
    table = pd.concat(parts, ignore_index=True)
    table["q_value"] = q_values(table["p_value"].to_numpy())
    return table[[*CORRELATION_COLUMNS, "probe"]]


def _undefine(part: pd.DataFrame, mask: np.ndarray, reason: str) -> None:
    """Tests of ``part`` under ``mask`` lose their statistics and say ``reason``."""
    statistics = ["spearman", "spearman_lo", "spearman_hi", "kendall", "p_value"]
    part.loc[mask, statistics] = np.nan
    part.loc[mask, "undefined"] = reason


def within_runs(study: Study) -> pd.DataFrame:
    """Per run with at least :data:`MIN_RUNS` probed epochs that have validation metrics:
    Spearman's ρ over epochs between each metric's trajectory and each validation metric."""
    validation = [c for c in study.table.columns if c.startswith("val_")]
    if not validation:
        return pd.DataFrame()
    from scipy import stats

    rows = []
    table = study.table[~study.table["metric"].isin(metrics_where("bookkeeping"))]
    epochs = table.dropna(subset=validation, how="all").groupby("run")["epoch"].nunique()
    table = table[table["run"].isin(epochs.index[epochs >= MIN_RUNS])]
    for (run, probe, metric, layer), part in table.groupby(["run", "probe", "metric", "layer"]):
        part = part.sort_values("epoch")
        for target in validation:
            ok = part[["value", target]].dropna()
            if len(ok) < MIN_RUNS or ok["value"].nunique() < 2 or ok[target].nunique() < 2:
                continue
            rho = stats.spearmanr(ok["value"], ok[target]).statistic
            rows.append(
                {
                    "run": run,
                    "probe": probe,
                    "metric": metric,
                    "layer": layer,
                    "validation_metric": target,
                    "epochs": len(ok),
                    "spearman": rho,
                }
            )
    return pd.DataFrame(rows)


def summarise_within_runs(within: pd.DataFrame) -> pd.DataFrame:
    """Across runs: how many, the median and mean ρ, and the share of runs with ρ > 0."""
    if within.empty:
        return within
    keys = ["probe", "metric", "layer", "validation_metric"]
    grouped = within.groupby(keys)["spearman"]
    return grouped.agg(
        runs="count",
        median_spearman="median",
        mean_spearman="mean",
        share_positive=lambda s: float((s > 0).mean()),
    ).reset_index()
