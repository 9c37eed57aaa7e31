"""A test with no answer says nothing: no ρ, no p, no q, no place in the correction and none
among the report's findings, with its reason in ``correlations.csv``."""

from __future__ import annotations

import itertools
import math
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf
from scipy import stats

from isoprobe.analysis.correlations import correlations
from isoprobe.analysis.independence import SHARED_WEIGHTS, weight_identity
from isoprobe.analysis.statistics import (
    CONSTANT_FORECAST,
    CONSTANT_METRIC,
    MIN_RUNS,
    TOO_FEW_RUNS,
    associate,
    spearman_columns,
)
from isoprobe.analysis.study import AnalysisError, load_study
from isoprobe.metrics.rank import is_weight_metric, rank_metric
from isoprobe.tasks.analyze import run_analyze
from isoprobe.tasks.sweep_analysis import AnalyzeSweep
from tests.analysis.probed_runs import analyse, probed_run
from tests.conftest import ROOT, compose_config

MODELS, DATASETS = 5, 6
WEIGHT_METRIC = rank_metric(0.01, "q")
ANALYZE_DEFAULTS = yaml.safe_load((ROOT / "configs" / "analyze" / "default.yaml").read_text())
COLUMNS = ["probe", "epoch", "global_step", "layer", "metric", "value", "note"]


def zero_shot_grid(root: Path) -> Path:
    """``MODELS`` zero-shot models × ``DATASETS`` data sets: each run records random isotropy
    metrics, a cluster count of 3 everywhere (constant) and an ε-rank of a projection that
    depends on the model alone (its weights), as the rank probe writes it."""
    rng = np.random.default_rng(5)
    for i, j in itertools.product(range(MODELS), range(DATASETS)):
        run = probed_run(
            root / f"{i * DATASETS + j}",
            f"model_{i}",
            f"dataset_{j}",
            blocks=2,
            epochs=1,
            rng=rng,
            overrides=(f"model=model_{i}", f"data=dataset_{j}"),
        )
        extra = pd.DataFrame(
            [
                ("rank", 0, 0, "encoder.0", WEIGHT_METRIC, 10.0 + 3 * i, ""),
                ("isotropy", 0, 0, "encoder.0", "n_clusters", 3.0, ""),
            ],
            columns=COLUMNS,
        )
        extra.to_csv(run / "rank_metrics.csv", mode="a", header=False, index=False)
    return root


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    return zero_shot_grid(tmp_path_factory.mktemp("grid") / "sweep")


@pytest.fixture(scope="module")
def table(grid) -> pd.DataFrame:
    return correlations(load_study([str(grid)]), n_boot=100, n_perm=200)


class _Tables(HTMLParser):
    """The report's tables, each under the heading before it: heading -> rows of cell text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.heading, self.cell, self.in_heading = "", None, False

    def handle_starttag(self, tag, attrs):
        if tag in ("h2", "h3"):
            self.heading, self.in_heading = "", True
        elif tag == "tr":
            self.tables.setdefault(self.heading, []).append([])
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("h2", "h3"):
            self.in_heading = False
        elif tag in ("td", "th") and self.cell is not None:
            self.tables[self.heading][-1].append(self.cell.strip())
            self.cell = None

    def handle_data(self, data):
        if self.in_heading:
            self.heading += data
        elif self.cell is not None:
            self.cell += data


def report_table(page: str, heading: str) -> pd.DataFrame:
    """The table of ``page`` under the heading that contains ``heading``."""
    parser = _Tables()
    parser.feed(page)
    (rows,) = [rows for title, rows in parser.tables.items() if heading in title]
    frame = pd.DataFrame(rows[1:], columns=rows[0])
    return frame.replace("", np.nan)


def test_a_constant_metric_or_forecast_has_no_statistics_and_says_why():
    rng = np.random.default_rng(0)
    x = np.column_stack([np.full(8, 2.0), rng.normal(size=8), rng.normal(size=8)])
    y = np.column_stack([rng.normal(size=8), np.full(8, 1.0), rng.normal(size=8)])
    found = associate(x, y, n_boot=100, n_perm=100)
    assert list(found.undefined) == [CONSTANT_METRIC, CONSTANT_FORECAST, ""]
    for name in ("spearman", "spearman_lo", "spearman_hi", "kendall", "p_value"):
        values = getattr(found, name)
        assert np.isnan(values[:2]).all(), name  # not the permutation floor 1/(n_perm + 1)
        assert np.isfinite(values[2]), name


def test_exactly_min_runs_is_defined_and_one_fewer_is_not():
    x = np.array([1.0, 3.0, 2.0, 4.0, 5.0])[:, None]
    at_minimum = associate(x[:MIN_RUNS], x[:MIN_RUNS] ** 2, n_boot=0, n_perm=100)
    below = associate(x[: MIN_RUNS - 1], x[: MIN_RUNS - 1], n_boot=0, n_perm=100)
    assert at_minimum.undefined[0] == "" and at_minimum.spearman[0] == 1.0
    assert below.undefined[0] == TOO_FEW_RUNS and np.isnan(below.p_value[0])


def test_a_metric_missing_for_some_runs_is_tested_on_the_others():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(9, 1)), rng.normal(size=(9, 1))
    holed = x.copy()
    holed[[2, 5]] = np.nan
    keep = np.isfinite(holed[:, 0])
    found = associate(holed, y, n_boot=0, n_perm=0)
    assert found.n[0] == 7
    assert found.spearman[0] == pytest.approx(stats.spearmanr(x[keep], y[keep]).statistic)


def test_an_interval_needs_rho_on_nearly_every_resample():
    # two values among four runs: one resample in eight is constant, too many to ignore
    two_values = associate(
        np.array([0.0, 0.0, 1.0, 1.0])[:, None], np.arange(4.0)[:, None], n_boot=400, n_perm=0
    )
    assert np.isfinite(two_values.spearman[0]) and np.isnan(two_values.spearman_lo[0])
    distinct = associate(np.arange(12.0)[:, None], np.arange(12.0)[:, None], n_boot=400, n_perm=0)
    assert distinct.spearman_lo[0] == 1.0


def test_kendall_tau_b_equals_scipy_with_ties_in_both():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, size=(15, 6)).astype(float)
    y = rng.integers(0, 4, size=(15, 6)).astype(float)
    found = associate(x, y, n_boot=0, n_perm=0)
    for j in range(6):
        assert found.kendall[j] == pytest.approx(stats.kendalltau(x[:, j], y[:, j]).statistic)


def test_permutation_p_with_ties_equals_the_exact_enumeration():
    x = np.array([1.0, 1.0, 2.0, 3.0, 3.0, 4.0])
    y = np.array([0.5, 0.2, 0.2, 0.9, 0.7, 0.9])
    observed = abs(stats.spearmanr(x, y).statistic)
    pairings = np.array(list(itertools.permutations(y)))
    rhos = spearman_columns(np.broadcast_to(x, pairings.shape).T, pairings.T)
    exact = np.mean(np.abs(rhos) >= observed - 1e-12)
    assert len(pairings) == math.factorial(6)
    found = associate(x[:, None], y[:, None], n_boot=0, n_perm=40000, seed=1)
    assert found.p_value[0] == pytest.approx(exact, abs=0.01)


def test_the_weights_a_probe_measured_are_named_by_run_or_by_what_was_loaded(grid):
    study = load_study([str(grid)])
    identity = weight_identity(study, "after").loc[study.runs["run"]]
    per_model = study.runs.assign(identity=identity.to_numpy()).groupby("model")["identity"]
    assert (per_model.nunique() == 1).all() and identity.nunique() == MODELS
    assert is_weight_metric(WEIGHT_METRIC) and not is_weight_metric(rank_metric(0.01))


def test_a_measure_of_the_weights_is_not_tested_across_runs_that_share_them(table):
    # encoder.0 inside one model; the first block where a group pools several models
    weights = table[
        (table["metric"] == WEIGHT_METRIC) & table["layer"].isin(["encoder.0", "first"])
    ]
    shared = weights[weights["group"].str.startswith(("all", "model="))]
    assert len(shared) and (shared["undefined"] == SHARED_WEIGHTS).all()
    assert shared[["spearman", "p_value", "q_value"]].isna().all().all()
    # on one data set every model has its own weights: five runs, five values
    own = weights[weights["group"].str.startswith("dataset=")]
    assert len(own) == DATASETS and own["undefined"].isna().all()
    assert own["p_value"].notna().all()


def test_a_constant_metric_is_undefined_everywhere(table):
    clusters = table[table["metric"] == "n_clusters"]
    assert len(clusters) and (clusters["undefined"] == CONSTANT_METRIC).all()
    assert clusters["p_value"].isna().all()


def test_q_values_are_benjamini_hochberg_over_the_exploratory_tests_alone(table):
    defined = table["undefined"].isna()
    assert (~defined).sum() > 0
    scan = table["family"] == "exploratory"
    assert scan.sum() and (scan & ~defined).sum() == 0
    expected = stats.false_discovery_control(table.loc[scan, "p_value"], method="bh")
    np.testing.assert_allclose(table.loc[scan, "q_value"], expected)
    assert table.loc[~defined, ["spearman", "kendall", "p_value", "q_value"]].isna().all().all()
    # repeats and descriptive tests have statistics but no q: they are not in the correction
    outside = table["family"].isin(["repeat", "descriptive"])
    assert outside.sum() and table.loc[outside, "q_value"].isna().all()


def test_the_report_lists_only_defined_tests_and_counts_the_others(grid, tmp_path):
    out = analyse(grid, tmp_path / "analysis")
    page = (out / "report.html").read_text()
    findings = report_table(page, "lowest q-values")
    assert findings["q_value"].notna().all() and findings["spearman"].notna().all()
    assert WEIGHT_METRIC not in set(findings["metric"]) or set(
        findings.loc[findings["metric"] == WEIGHT_METRIC, "group"]
    ) <= {f"dataset=dataset_{j}" for j in range(DATASETS)}
    table = pd.read_csv(out / "correlations.csv")
    for reason, count in table["undefined"].value_counts().items():
        assert f"{reason}: {count}" in page


def test_a_nan_block_leaves_its_run_out_of_the_mean_over_blocks(grid):
    study = load_study([str(grid)])
    hole = (study.table["run"] == study.runs["run"].iloc[0]) & (study.table["layer"] == "encoder.1")
    study.table.loc[hole & (study.table["metric"] == "isoscore"), "value"] = np.nan
    found = correlations(study, n_boot=0, n_perm=0)
    isoscore = found[found["metric"] == "isoscore"]
    model = f"model={study.runs['model'].iloc[0]}"
    n = isoscore[isoscore["group"] == model].set_index("layer")["n"]
    assert (n["encoder.0"], n["encoder.1"], n["mean"]) == (DATASETS, DATASETS - 1, DATASETS - 1)
    # the group of every model compares layers by depth: encoder.1 is each model's last block
    n = isoscore[isoscore["group"] == "all"].set_index("layer")["n"]
    assert (n["first"], n["last"], n["mean"]) == (30, 29, 29)
    assert "encoder.0" not in n


def test_the_permutation_p_value_counts_scipys_rho_over_the_same_pairings():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(12, 40)), rng.normal(size=(12, 1))
    found = associate(x, y, n_boot=0, n_perm=400, seed=9)
    rho = spearman_columns(x, y)
    again = np.random.default_rng(9)
    order = np.argsort(again.random((400, 12)), axis=1)
    ry = stats.rankdata(y, axis=0)[order, 0]  # pairings × runs
    permuted = np.array([[stats.spearmanr(x[:, j], p).statistic for j in range(40)] for p in ry])
    expected = (1 + (np.abs(permuted) >= np.abs(rho) - 1e-12).sum(axis=0)) / 401
    np.testing.assert_allclose(found.p_value, expected)


def analysis_config(runs: Path, output: Path, *overrides: str):
    return compose_config(
        output,
        ["task=analyze", f"analyze.runs={runs}", "analyze.n_boot=20", "analyze.n_perm=20"]
        + ["logger=none", *overrides],
    )


def test_an_isotropy_metric_no_run_recorded_is_refused_before_anything_is_written(grid, tmp_path):
    out = tmp_path / "analysis"
    with pytest.raises(AnalysisError, match=r"analyze.isotropy_metric='nosuch'.*choose one of"):
        run_analyze(analysis_config(grid, out, "analyze.isotropy_metric=nosuch"))
    assert not (out / "study.csv").exists() and not (out / "report.html").exists()


def test_a_study_of_the_rank_probe_alone_is_analysed_with_the_default_metric(grid, tmp_path):
    ranks_only = tmp_path / "ranks"
    shutil.copytree(grid, ranks_only)
    for records in ranks_only.glob("*/probe_metrics.csv"):
        records.unlink()
    for records in ranks_only.glob("*/rank_metrics.csv"):
        frame = pd.read_csv(records)
        frame[frame["probe"] == "rank"].to_csv(records, index=False)
    out = tmp_path / "analysis"
    run_analyze(analysis_config(ranks_only, out))
    assert (out / "report.html").is_file() and (out / "flow_of_ranks.png").is_file()
    page = (out / "report.html").read_text()
    assert "Not asked in this study: no run recorded the isotropy measure cos_inter" in page
    assert "The question&#x27;s tests" not in page


def test_a_sweeps_refused_analysis_ends_the_sweep_with_its_message(grid, tmp_path, capsys):
    """Hydra would turn the callback's exception into a warning and exit 0."""
    sweep = tmp_path / "sweep"
    shutil.copytree(grid, sweep)
    config = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(sweep)}},
            "analyze": {**ANALYZE_DEFAULTS, "isotropy_metric": "nosuch"},
            "logger": None,
        }
    )
    with pytest.raises(SystemExit) as ended:
        AnalyzeSweep().on_multirun_end(config)
    assert ended.value.code == 1
    assert "Error: analyze.isotropy_metric='nosuch'" in capsys.readouterr().err
    assert not (sweep / "analysis" / "report.html").exists()
