"""Does the geometry predict the forecast error? Rank associations across runs and over a
run's probes.

Across runs (``correlations.csv``): one observation per run, the geometry metric measured on
the same weights that made the forecast: ``before_*`` errors pair with the run's first probe
(zero-shot, or epoch 0 of a fine-tuning run), ``after_*`` and ``final_*`` errors with its last
(a zero-shot run has one probed epoch, so its last is its first). A test is one
metric × layer choice × forecast metric × group; the groups are ``all`` runs pooled, each
``model=<m>``, and each ``dataset=<d>`` that several models ran on. Inside one model, a layer is
its name; a group that pools several models compares layers by relative depth alone, since
``decoder.0`` of one architecture is not ``decoder.0`` of another: the ``first``, ``middle``
and ``last`` block of each model in the probe's order, the ``mean`` over its blocks, and
``embed``.

Each test belongs to one family (:mod:`.family`): the declared question (the
``analyze.isotropy_metric`` of the last block against the primary forecast metric, per model
and within model, corrected on its own), the exploratory scan (corrected on its own),
descriptive tests (too few runs to ever reach the level), repeats of a test already counted,
and undefined tests (no ρ, τ, interval, p or q, :mod:`.statistics`), among them every test of a
measure of the weights alone over runs that share weights (:mod:`.independence`).

Within runs (``within_run.csv``): for fine-tuning runs with per-epoch validation metrics, each
metric's trajectory over its probes against the validation error of the same weights (the
probes at the steps where a validation ran), per run.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoprobe.analysis.family import (
    WITHIN_MODEL,
    Question,
    assign_families,
    log_pairings_of,
    sameness_key,
)
from isoprobe.analysis.independence import SHARED_WEIGHTS, shared_weight_tests
from isoprobe.analysis.statistics import (
    MIN_RUNS,
    TOO_FEW_RUNS,
    associate,
    stratified_spearman,
)
from isoprobe.analysis.study import PROBE_TIME, Study, at_probe, probes_per_run
from isoprobe.metrics import metrics_where
from isoprobe.models.layers import is_block

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
    "family",
    "repeats",
    "undefined",
)
#: the layer choices that mean the same in every architecture (module docstring)
DEPTH_CHOICES = ("first", "middle", "last", "mean")
ACROSS_MODELS = ("embed", *DEPTH_CHOICES)
#: forecast-metric prefix -> the probed epoch it pairs with (:func:`geometry_at`)
PAIRED_PROBE = {"before": "before", "after": "after", "final": "after"}


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
    at = at_probe(table, when)
    wide = at.pivot_table(
        index="run", columns=["probe", "metric", "layer"], values="value", aggfunc="first"
    )
    order = {layer: i for i, layer in enumerate(pd.unique(table["layer"]))}
    layers = pd.Series(pd.unique(at["layer"]))
    block_names = set(filter(is_block, layers.astype(str)))
    blocks = at[at["layer"].isin(block_names)]
    if len(blocks):
        rank = blocks["layer"].map(order)
        by_run = rank.groupby([blocks["run"], blocks["probe"]])
        # the middle block: the lower median of the blocks' places, one block per run
        places = by_run.rank(method="dense")
        middle_place = np.floor(
            (places.groupby([blocks["run"], blocks["probe"]]).transform("max") + 1) / 2
        )
        chosen = {
            "first": rank == by_run.transform("min"),
            "middle": places == middle_place,
            "last": rank == by_run.transform("max"),
        }
        # the mean over a run's blocks is NaN where one of them is (not the others' mean)
        values = blocks.groupby(["run", "probe", "metric"])["value"]
        mean = values.mean().where(values.count() == values.size())
        mean = mean.unstack(["probe", "metric"]).dropna(axis=1, how="all")
        extra = [
            _with_layer(
                blocks[where].pivot_table(
                    index="run", columns=["probe", "metric"], values="value", aggfunc="first"
                ),
                choice,
            )
            for choice, where in chosen.items()
        ]
        extra.append(_with_layer(mean, "mean"))
        wide = pd.concat([wide, *extra], axis=1)
    return wide.sort_index(axis=1)


def _with_layer(frame: pd.DataFrame, layer: str) -> pd.DataFrame:
    frame = frame.copy()
    frame.columns = pd.MultiIndex.from_tuples([(p, m, layer) for p, m in frame.columns])
    return frame


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


def mixes_models(runs: pd.DataFrame, members: list[str]) -> bool:
    """Whether the runs ``members`` of ``runs`` (indexed by run) are of several models."""
    return runs.loc[members, "model"].nunique() > 1


def comparable_columns(geometry: pd.DataFrame, mixed: bool) -> pd.DataFrame:
    """The columns of ``geometry`` a group may test: every layer inside one model, the
    architecture-free choices (:data:`ACROSS_MODELS`) when the group ``mixed`` models."""
    if not mixed:
        return geometry
    return geometry.loc[:, geometry.columns.get_level_values(2).isin(ACROSS_MODELS)]


def forecast_order(forecasts: list[str]) -> list[str]:
    """``before_*``, then ``after_*``, then ``final_*``: a ``final_*`` test that repeats one of
    the others is the one marked as the repeat."""
    return sorted(forecasts, key=lambda f: list(PAIRED_PROBE).index(f.split("_", 1)[0]))


def correlations(
    study: Study,
    n_boot: int = 1000,
    n_perm: int = 1000,
    seed: int = 0,
    question: Question | None = None,
) -> pd.DataFrame:
    """The across-run table of the module docstring (:data:`CORRELATION_COLUMNS` + ``probe``),
    one row per test, each with its family (:func:`~.family.assign_families`); with a
    ``question``, its within-model test too (group :data:`~.family.WITHIN_MODEL`)."""
    runs = study.runs.set_index("run")
    wide = {when: geometry_at(study, when) for when in ("before", "after")}
    parts, keys = [], []
    for forecast in forecast_order(study.forecast_metrics):
        when = PAIRED_PROBE[forecast.split("_", 1)[0]]
        for group, members in groups(study).items():
            rows = [
                r for r in members if r in wide[when].index and np.isfinite(runs.at[r, forecast])
            ]
            if not rows:
                continue
            geometry = comparable_columns(wide[when], mixes_models(runs, rows))
            x = geometry.loc[rows].to_numpy(dtype=float)
            y = runs.loc[rows, forecast].to_numpy(dtype=float)
            found = associate(x, y[:, None], n_boot=n_boot, n_perm=n_perm, seed=seed)
            columns = geometry.columns
            metrics = columns.get_level_values(1)
            part = pd.DataFrame(
                {
                    "probe": columns.get_level_values(0),
                    "metric": metrics,
                    "layer": columns.get_level_values(2),
                    "forecast_metric": forecast,
                    "group": group,
                    "n": found.n,
                    "spearman": found.spearman,
                    "spearman_lo": found.spearman_lo,
                    "spearman_hi": found.spearman_hi,
                    "kendall": found.kendall,
                    "p_value": found.p_value,
                    "log_pairings": log_pairings_of(found.n),
                    "undefined": np.where(found.undefined == "", None, found.undefined),
                }
            )
            shared = shared_weight_tests(study, when, rows, metrics, x)
            _undefine(part, shared & (found.undefined != TOO_FEW_RUNS), SHARED_WEIGHTS)
            parts.append(part)
            keys += [sameness_key(rows, x[:, j], y) for j in range(x.shape[1])]
    if question is not None:
        within = within_model_test(study, question, n_perm, seed)
        if within is not None:
            parts.append(within)
            keys.append(("within model", question))
    if not parts:
        return pd.DataFrame(columns=[*CORRELATION_COLUMNS, "probe"])
    table = pd.concat(parts, ignore_index=True)
    primary = question.asks(table) if question is not None else np.zeros(len(table), bool)
    label = (table["forecast_metric"] + ", " + table["group"].astype(str)).tolist()
    table = assign_families(table, keys, primary, table["log_pairings"].to_numpy(), label)
    return table[[*CORRELATION_COLUMNS, "probe"]]


def within_model_test(
    study: Study, question: Question, n_perm: int = 1000, seed: int = 0
) -> pd.DataFrame | None:
    """The question's combined test: ρ of its metric with its forecast inside each model,
    weighted by the model's runs, p by permuting inside each model
    (:func:`~.statistics.stratified_spearman`); one row of the correlations table, or None
    where the study lacks the metric or the forecast. Undefined where no model has
    :data:`~.statistics.MIN_RUNS` complete runs with neither side constant."""
    when = PAIRED_PROBE[question.forecast.split("_", 1)[0]]
    geometry = geometry_at(study, when)
    column = (question.probe, question.metric, question.layer)
    runs = study.runs.set_index("run")
    if column not in geometry.columns or question.forecast not in runs:
        return None
    rows = [r for r in geometry.index if np.isfinite(runs.at[r, question.forecast])]
    x = geometry.loc[rows, [column]].to_numpy(dtype=float)
    y = runs.loc[rows, question.forecast].to_numpy(dtype=float)
    models = runs.loc[rows, "model"].astype(str).to_numpy()
    found = stratified_spearman(x, y, models, n_perm, seed)
    defined = bool(found.n[0])
    return pd.DataFrame(
        {
            "probe": [question.probe],
            "metric": question.metric,
            "layer": question.layer,
            "forecast_metric": question.forecast,
            "group": WITHIN_MODEL,
            "n": found.n,
            "spearman": found.spearman,
            "spearman_lo": np.nan,
            "spearman_hi": np.nan,
            "kendall": np.nan,
            "p_value": found.p_value,
            "log_pairings": found.log_pairings,
            "undefined": None if defined else f"no model with {MIN_RUNS} runs that vary",
        }
    )


def _undefine(part: pd.DataFrame, mask: np.ndarray, reason: str) -> None:
    """Tests of ``part`` under ``mask`` lose their statistics and say ``reason``."""
    statistics = ["spearman", "spearman_lo", "spearman_hi", "kendall", "p_value"]
    part.loc[mask, statistics] = np.nan
    part.loc[mask, "undefined"] = reason


def within_runs(study: Study) -> pd.DataFrame:
    """Per run with at least :data:`MIN_RUNS` probes that have validation metrics:
    Spearman's ρ over its probes (those at a validation's step) between each metric's
    trajectory and each validation metric."""
    validation = [c for c in study.table.columns if c.startswith("val_")]
    if not validation:
        return pd.DataFrame()
    from scipy import stats

    rows = []
    table = study.table[~study.table["metric"].isin(metrics_where("bookkeeping"))]
    probes = probes_per_run(table.dropna(subset=validation, how="all"))
    table = table[table["run"].isin(probes.index[probes >= MIN_RUNS])]
    for (run, probe, metric, layer), part in table.groupby(["run", "probe", "metric", "layer"]):
        part = part.sort_values(PROBE_TIME)
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
