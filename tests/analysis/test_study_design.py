"""A study whose design can be trusted: on a zero-shot sweep of several models over several data
sets, every table ``task=analyze`` writes is recomputed here from ``study.csv`` alone with scipy:
the rule of independence in every table, each test counted once, groups too small for the level
kept out of the correction, layers compared by depth across models, the question first."""

from __future__ import annotations

import html
import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from isoprobe.analysis.family import ALPHA, WITHIN_MODEL, smallest_p
from isoprobe.analysis.independence import SHARED_WEIGHTS, constant_within_model
from isoprobe.analysis.stratified import HELD_OUT_TOO_FEW
from isoprobe.metrics.rank import is_weight_metric, rank_metric
from isoprobe.tasks.analyze import run_analyze
from tests.analysis.probed_runs import probed_run
from tests.conftest import compose_config

MODELS, DATASETS, BLOCKS = 4, 10, 3
HELD_OUT = ("dataset_6", "dataset_7", "dataset_8", "dataset_9")
WEIGHT_METRIC = rank_metric(0.01, "q")
COLUMNS = ["probe", "epoch", "global_step", "layer", "metric", "value", "note"]
BLOCK = re.compile(r"^[A-Za-z_]+\.(\d+)$")


def zero_shot_sweep(root: Path) -> Path:
    """``MODELS`` zero-shot models × ``DATASETS`` data sets, ``BLOCKS`` blocks each; the last
    block's ``cos_inter`` follows the run's error (the papers' association, planted), and an
    ε-rank of a projection is one value per model (its weights) at every block."""
    rng = np.random.default_rng(11)
    for i, j in itertools.product(range(MODELS), range(DATASETS)):
        run = probed_run(
            root / f"{i * DATASETS + j}",
            f"model_{i}",
            f"dataset_{j}",
            blocks=BLOCKS,
            epochs=1,
            rng=rng,
            overrides=(f"model=model_{i}", f"data=dataset_{j}"),
        )
        nmse = pd.read_json(run / "summary.json")["before"]["test/nmse"]
        probes = pd.read_csv(run / "probe_metrics.csv")
        last = (probes["layer"] == f"encoder.{BLOCKS - 1}") & (probes["metric"] == "cos_inter")
        probes.loc[last, "value"] = nmse + rng.normal(0, 0.05)
        probes.to_csv(run / "probe_metrics.csv", index=False)
        weights = pd.DataFrame(
            [
                ("rank", 0, 0, f"encoder.{b}", WEIGHT_METRIC, 10.0 + 3 * i + b, "")
                for b in range(BLOCKS)
            ],
            columns=COLUMNS,
        )
        weights.to_csv(run / "rank_metrics.csv", mode="a", header=False, index=False)
    return root


@pytest.fixture(scope="module")
def analysed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("design")
    sweep = zero_shot_sweep(root / "sweep")
    output = root / "analysis"
    cfg = compose_config(
        output,
        [
            "task=analyze",
            f"analyze.runs={sweep}",
            "analyze.n_boot=0",
            "analyze.n_perm=4000",
            f"analyze.confirm=[{','.join(HELD_OUT)}]",
            "logger=none",
        ],
    )
    run_analyze(cfg)
    return output


@pytest.fixture(scope="module")
def study(analysed) -> pd.DataFrame:
    return pd.read_csv(analysed / "study.csv")


def layer_values(study: pd.DataFrame, probe: str, metric: str, layer: str) -> pd.Series:
    """Run -> the value of ``metric`` at ``layer``, the depth choices worked out here from the
    layer names alone: the first, middle (lower median) and last block by index, their mean."""
    rows = study[(study["probe"] == probe) & (study["metric"] == metric)]
    if layer not in ("first", "middle", "last", "mean"):
        return rows[rows["layer"] == layer].groupby("run")["value"].first()
    blocks = rows[rows["layer"].str.fullmatch(BLOCK.pattern)].copy()
    blocks["index"] = blocks["layer"].str.extract(BLOCK.pattern, expand=False).astype(int)
    out = {}
    for run, part in blocks.groupby("run"):
        part = part.sort_values("index")
        pick = {"first": 0, "middle": (len(part) + 1) // 2 - 1, "last": len(part) - 1}
        out[run] = part["value"].mean() if layer == "mean" else part["value"].iloc[pick[layer]]
    return pd.Series(out)


def members(runs: pd.DataFrame, group: str) -> pd.Index:
    if group == "all":
        return runs.index
    factor, _, value = group.partition("=")
    return runs.index[runs[factor].astype(str) == value]


def run_factors(study: pd.DataFrame) -> pd.DataFrame:
    return study.groupby("run")[["model", "dataset", "before_test_nmse"]].first()


def test_every_correlation_equals_scipys_on_study_csv(analysed, study):
    runs = run_factors(study)
    table = pd.read_csv(analysed / "correlations.csv")
    answered = table[table["family"] != "undefined"]
    assert len(answered) > 100
    for row in answered[answered["group"] != WITHIN_MODEL].itertuples():
        x = layer_values(study, row.probe, row.metric, row.layer)
        group = members(runs, row.group)
        pair = pd.concat([x.reindex(group), runs.loc[group, row.forecast_metric]], axis=1).dropna()
        assert row.n == len(pair)
        assert row.spearman == pytest.approx(stats.spearmanr(*pair.T.values).statistic, abs=1e-12)
        assert row.kendall == pytest.approx(stats.kendalltau(*pair.T.values).statistic, abs=1e-12)
    for family in ("exploratory", "primary"):
        tests = table[table["family"] == family]
        expected = stats.false_discovery_control(tests["p_value"], method="bh")
        np.testing.assert_allclose(tests["q_value"], expected, rtol=1e-12)
    assert table.loc[~table["family"].isin(["exploratory", "primary"]), "q_value"].isna().all()


def test_a_weight_measure_is_one_observation_per_set_of_weights_in_every_table(analysed):
    table = pd.read_csv(analysed / "correlations.csv")
    weights = table[table["metric"].map(is_weight_metric)]
    shared = weights[~weights["group"].str.startswith("dataset=")]
    assert len(shared) and (shared["undefined"] == SHARED_WEIGHTS).all()
    assert shared[["spearman", "p_value", "q_value"]].isna().all().all()
    # inside one data set each model brings weights of its own: four runs, four weights
    assert weights.loc[weights["group"].str.startswith("dataset="), "undefined"].isna().all()
    # the same four weights in every data set are still four observations, not forty
    stratified = pd.read_csv(analysed / "stratified.csv")
    weights = stratified[stratified["metric"].map(is_weight_metric)]
    assert len(weights) and weights["undefined"].notna().all()
    assert weights[["spearman", "p_value", "q_value"]].isna().all().all()
    by_dataset = weights[weights["stratified_by"] == "dataset"]
    assert len(by_dataset) and (by_dataset["undefined"] == SHARED_WEIGHTS).all()
    assert not stratified.loc[stratified["q_value"] < ALPHA, "metric"].map(is_weight_metric).any()


def test_groups_of_several_models_compare_layers_by_depth_and_one_model_by_name(analysed):
    table = pd.read_csv(analysed / "correlations.csv")
    mixed = table[table["group"].str.startswith(("all", "dataset="))]
    assert set(mixed["layer"]) <= {"embed", "first", "middle", "last", "mean"}
    one = table[table["group"] == "model=model_0"]
    assert {f"encoder.{b}" for b in range(BLOCKS)} <= set(one["layer"])
    stratified = pd.read_csv(analysed / "stratified.csv")
    assert set(stratified["layer"]) <= {"embed", "first", "middle", "last", "mean"}


def test_a_group_too_small_for_the_level_is_descriptive_and_outside_the_correction(analysed):
    table = pd.read_csv(analysed / "correlations.csv")
    datasets = table[table["group"].str.startswith("dataset=") & (table["family"] != "undefined")]
    # four models on a data set: the smallest p of four runs is 2/4! = 0.083 > 0.05
    assert smallest_p(np.log(24.0)) == pytest.approx(1 / 12)
    assert len(datasets) and (datasets["family"].isin(["descriptive", "repeat"])).all()
    assert datasets["q_value"].isna().all() and datasets["spearman"].notna().all()
    page = (analysed / "report.html").read_text()
    assert "Groups too small to reach the level, so descriptive only: dataset_0" not in page
    assert "descriptive only: dataset=dataset_0" in page


def test_each_test_is_counted_once(analysed, study):
    table = pd.read_csv(analysed / "correlations.csv")
    counted = table[table["family"].isin(["exploratory", "primary", "descriptive"])]
    runs = run_factors(study)
    seen = {}
    for row in counted[counted["group"] != WITHIN_MODEL].itertuples():
        group = members(runs, row.group)
        x = layer_values(study, row.probe, row.metric, row.layer).reindex(group)
        pair = pd.concat([x, runs.loc[group, row.forecast_metric]], axis=1).dropna()
        key = (tuple(pair.index), tuple(pair.iloc[:, 0]), tuple(pair.iloc[:, 1]))
        assert key not in seen, (row, seen.get(key))
        seen[key] = row
    # inside one model the depth choices repeat named blocks (first is encoder.0): counted once
    repeats = table[table["family"] == "repeat"]
    assert len(repeats) and repeats["repeats"].notna().all()
    assert repeats["q_value"].isna().all()


def test_the_question_is_declared_first_with_its_own_correction(analysed, study):
    runs = run_factors(study)
    primary = pd.read_csv(analysed / "primary.csv")
    assert set(primary["group"]) == {WITHIN_MODEL, *(f"model=model_{i}" for i in range(MODELS))}
    assert (primary[["probe", "metric", "layer"]] == ["isotropy", "cos_inter", "last"]).all().all()
    x = layer_values(study, "isotropy", "cos_inter", "last")
    weighted, total = 0.0, 0
    for _, part in runs.groupby("model"):
        weighted += len(part) * stats.spearmanr(x[part.index], part["before_test_nmse"]).statistic
        total += len(part)
    within = primary.set_index("group").loc[WITHIN_MODEL]
    assert within["n"] == total and within["spearman"] == pytest.approx(weighted / total)
    assert within["q_value"] < ALPHA  # the planted association is found
    expected = stats.false_discovery_control(primary["p_value"], method="bh")
    np.testing.assert_allclose(primary["q_value"], expected, rtol=1e-12)
    page = (analysed / "report.html").read_text()
    headings = [html.unescape(h) for h in re.findall(r"<h2>(.*?)</h2>", page)]
    assert headings[0].startswith("The question: does the last layer's cos_inter predict")
    assert headings[1] == "Figures" and headings[2].startswith("Exploration")


def test_the_confirmation_equals_scipy_on_the_held_out_runs(analysed, study):
    runs = run_factors(study)
    held = runs[runs["dataset"].isin(HELD_OUT)]
    confirmation = pd.read_csv(analysed / "confirmation.csv")
    assert len(confirmation)
    tested = confirmation[confirmation["untested"].isna()]
    assert len(tested) and WITHIN_MODEL in set(tested["group"])
    for row in tested[tested["group"] != WITHIN_MODEL].itertuples():
        x = layer_values(study, row.probe, row.metric, row.layer)
        group = members(held, row.group)
        pair = pd.concat([x.reindex(group), held.loc[group, row.forecast_metric]], axis=1).dropna()
        assert row.confirm_n == len(pair)
        assert row.confirm_spearman == pytest.approx(stats.spearmanr(*pair.T.values).statistic)
    q = stats.false_discovery_control(tested["confirm_p"], method="bh")
    np.testing.assert_allclose(tested["confirm_q"], q, rtol=1e-12)
    agree = np.sign(tested["confirm_spearman"]) == np.sign(tested["explore_spearman"])
    assert (tested["holds"].astype(bool) == (agree & (q < ALPHA))).all()
    # one model's four held-out runs cannot reach the level: the finding is kept, untested
    per_model = confirmation[confirmation["group"].str.startswith("model=")]
    assert len(per_model) and (per_model["untested"] == HELD_OUT_TOO_FEW).all()


def test_an_empty_confirmation_writes_its_table_and_says_so(tmp_path, capsys):
    sweep = zero_shot_sweep(tmp_path / "sweep")
    noise = np.random.default_rng(3)
    for run in sweep.iterdir():  # no association left anywhere: nothing to find
        probes = pd.read_csv(run / "probe_metrics.csv")
        probes["value"] = noise.uniform(size=len(probes))
        probes.to_csv(run / "probe_metrics.csv", index=False)
    output = tmp_path / "analysis"
    cfg = compose_config(
        output,
        [
            "task=analyze",
            f"analyze.runs={sweep}",
            "analyze.n_boot=0",
            "analyze.n_perm=200",
            "analyze.confirm=[dataset_9]",
            "logger=none",
        ],
    )
    run_analyze(cfg)
    confirmation = pd.read_csv(output / "confirmation.csv")
    assert confirmation.empty and "untested" in confirmation.columns
    said = capsys.readouterr().out
    assert "Confirmation (held out: runs of dataset_9)" in said and "found 0" in said
    assert "too small to reach the level: all" in said
    assert "found 0" in (output / "report.html").read_text()


def test_selection_beats_a_baseline_and_flags_a_measure_that_names_the_model(analysed):
    selection = pd.read_csv(analysed / "selection.csv")
    models = selection[selection["selection"].str.startswith("models on a data set")]
    baseline = models[models["metric"] == "best model elsewhere"]
    assert len(baseline) == 1 and baseline["tasks"].iloc[0] == DATASETS
    weights = models[models["metric"].map(is_weight_metric)]
    assert len(weights) and (weights["models_constant"] == 1.0).all()
    isotropy = models[(models["metric"] == "cos_inter") & (models["layer"] == "last")]
    assert len(isotropy) and (isotropy["models_constant"] == 0.0).all()


def test_models_constant_is_the_share_of_models_a_measure_cannot_tell_runs_apart_in():
    models = pd.Series(["a", "a", "b", "b", "c", "c", "d"], index=list("1234567"))
    values = pd.DataFrame(
        {
            "weights": [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0],  # one value per model
            "drift": [0.0, 0.0, 0.0, 0.0, 0.1, 0.3, 0.0],  # c trained anew on each data set
            "isotropy": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
        },
        index=models.index,
    )
    shares = constant_within_model(values, models)  # d has one run: it says nothing
    assert shares.to_dict() == {"weights": 1.0, "drift": pytest.approx(2 / 3), "isotropy": 0.0}
