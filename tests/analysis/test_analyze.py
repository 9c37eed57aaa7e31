"""task=analyze on real tiny runs: the join, the pairing, the report, and every refusal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from isoprobe.analysis.correlations import CORRELATION_COLUMNS, correlations, within_runs
from isoprobe.analysis.study import AnalysisError, Study, add_final_forecast, load_study
from tests.conftest import ROOT, TINY_MODEL, TINY_RUN

pytestmark = pytest.mark.slow

MODELS = ("chronos_bolt", "patchtst")


def run(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two zero-shot multiruns, each model × energy, weather: four runs under one folder."""
    root = tmp_path_factory.mktemp("sweep")
    tiny = [o for o in TINY_RUN if not o.startswith(("trainer.max_epochs", "data.max_train"))]
    for model in MODELS:
        run(
            "-m",
            "task=probe",
            f"model={model}",
            *TINY_MODEL[model],
            "data=energy,weather",
            *tiny,
            "logger=none",
            f"hydra.sweep.dir={root / model}",
            cwd=root,
        )
    return root


@pytest.fixture(scope="module")
def analysis(sweep) -> Path:
    out = sweep.parent / (sweep.name + "-analysis")
    done = run(
        "task=analyze",
        f"analyze.runs={sweep}",
        "analyze.n_boot=200",
        "analyze.n_perm=200",
        f"hydra.run.dir={out}",
        cwd=sweep.parent,
    )
    (sweep.parent / "analysis-stdout.txt").write_text(done.stdout)
    return out


def test_the_analysis_names_each_file_it_wrote_once(analysis):
    stdout = (analysis.parent / "analysis-stdout.txt").read_text()
    listed = [line.strip() for line in stdout.splitlines() if line.startswith(f"  {analysis}")]
    assert len(listed) == len(set(listed)) > 5
    assert all(Path(path).is_file() for path in listed)
    assert {"study.csv", "correlations.csv", "report.html"} <= {Path(p).name for p in listed}


def run_dirs(sweep: Path) -> list[Path]:
    return sorted(p.parent.parent for p in sweep.glob("**/.hydra/config.yaml"))


def last_block(records: pd.DataFrame) -> str:
    blocks = [layer for layer in pd.unique(records["layer"]) if layer.rsplit(".", 1)[-1].isdigit()]
    return blocks[-1]


def test_study_holds_every_record_with_its_runs_factors_and_forecast(sweep, analysis):
    study = pd.read_csv(analysis / "study.csv")
    runs = run_dirs(sweep)
    assert len(runs) == 4
    total = 0
    for directory in runs:
        name = str(directory.relative_to(sweep))
        config = yaml.safe_load((directory / ".hydra" / "config.yaml").read_text())
        summary = json.loads((directory / "summary.json").read_text())
        records = pd.concat(
            [pd.read_csv(directory / f) for f in ("probe_metrics.csv", "rank_metrics.csv")]
        )
        total += len(records)
        mine = study[study["run"] == name]
        assert len(mine) == len(records)
        assert set(mine["model"]) == {config["model"]["name"]}
        assert set(mine["dataset"]) == {config["data"]["dataset"]}
        assert set(mine["context_length"]) == {config["data"]["context_length"]}
        assert mine["before_test_nmse"].iloc[0] == pytest.approx(summary["before"]["test/nmse"])
        assert mine["before_test_wql"].iloc[0] == pytest.approx(summary["before"]["test/wql"])
    assert len(study) == total
    assert set(pd.read_parquet(analysis / "study.parquet")["run"]) == set(study["run"])


def test_last_layer_correlation_equals_scipy_on_the_run_files(sweep, analysis):
    table = pd.read_csv(analysis / "correlations.csv")
    assert list(table.columns[: len(CORRELATION_COLUMNS)]) == list(CORRELATION_COLUMNS)
    values, errors = [], []
    for directory in run_dirs(sweep):
        records = pd.read_csv(directory / "probe_metrics.csv")
        at = records[(records["metric"] == "cos_inter") & (records["epoch"] == 0)]
        values.append(at[at["layer"] == last_block(records)]["value"].iloc[0])
        errors.append(json.loads((directory / "summary.json").read_text())["before"]["test/nmse"])
    row = table[
        (table["metric"] == "cos_inter")
        & (table["layer"] == "last")
        & (table["forecast_metric"] == "before_test_nmse")
        & (table["group"] == "all")
    ].iloc[0]
    assert row["n"] == 4
    assert row["spearman"] == pytest.approx(stats.spearmanr(values, errors).statistic)
    assert row["kendall"] == pytest.approx(stats.kendalltau(values, errors).statistic)
    assert row["spearman_lo"] <= row["spearman"] <= row["spearman_hi"]
    # two runs per model: no statistics for a model's own group
    per_model = table[table["group"] == "model=patchtst"]
    assert (per_model["n"] <= 2).all() and per_model["spearman"].isna().all()


def test_report_embeds_the_figures_and_a_sortable_table(analysis):
    page = (analysis / "report.html").read_text()
    # no epochs: no trajectories; two models: one model-against-model heatmap
    figures = ("papers_form", "scatter", "heatmap", "flow_of_ranks", "model_similarity/pair0")
    for figure in figures:
        assert (analysis / f"{figure}.png").is_file()
    assert page.count("data:image/png;base64,") == len(figures)
    assert 'class="dataframe sortable"' in page and "addEventListener" in page
    assert "Benjamini" in page and "fewer than 4 runs" in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained: nothing fetched


def test_no_runs_found_says_where_it_looked(tmp_path):
    with pytest.raises(AnalysisError, match=f"no runs found .*Looked in: {tmp_path}"):
        load_study([str(tmp_path)])


def copy_with(sweep: Path, tmp_path: Path, edit) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(sweep, target)
    edit(run_dirs(target)[0])
    return target


def test_runs_probed_differently_are_refused_unless_allowed(sweep, tmp_path):
    def more_tokens(directory: Path) -> None:
        path = directory / ".hydra" / "config.yaml"
        config = yaml.safe_load(path.read_text())
        config["callbacks"]["probe"]["max_tokens"] = 999
        path.write_text(yaml.safe_dump(config))

    copied = copy_with(sweep, tmp_path, more_tokens)
    with pytest.raises(AnalysisError, match=r"callbacks\.probe\.max_tokens: 300, 999"):
        load_study([str(copied)])
    assert len(load_study([str(copied)], allow_mixed=True).runs) == 4


def test_a_run_without_forecast_metrics_is_left_out_and_named(sweep, tmp_path):
    copied = copy_with(sweep, tmp_path, lambda d: (d / "summary.json").unlink())
    study = load_study([str(copied)])
    assert len(study.runs) == 3
    assert list(study.left_out.values()) == [
        "no forecast metrics (summary.json without before/after)"
    ]


def test_glob_and_several_paths_find_the_same_runs(sweep):
    by_glob = load_study([str(sweep / "*")])
    by_list = load_study([str(sweep / m) for m in MODELS])
    assert sorted(by_glob.runs["run"]) == sorted(by_list.runs["run"])
    assert len(by_glob.runs) == 4


def test_within_run_association_over_epochs():
    epochs = np.arange(6)
    rows = []
    for run, sign in (("a", 1), ("b", -1)):
        for e in epochs:
            rows.append(
                {
                    "run": run,
                    "probe": "isotropy",
                    "epoch": e,
                    "global_step": 10 * e,
                    "layer": "encoder.0",
                    "metric": "cos_inter",
                    "value": float(e),
                    "val_loss": sign * e**2,
                }
            )
    study = Study(pd.DataFrame(rows), pd.DataFrame(), [], pd.DataFrame())
    within = within_runs(study).set_index("run")
    assert within.loc["a", "spearman"] == pytest.approx(1.0)
    assert within.loc["b", "spearman"] == pytest.approx(-1.0)
    assert set(within["epochs"]) == {6}


def test_a_study_experiment_ends_with_its_report(tmp_path):
    """One command: the sweep, then task=analyze on it (the Hydra callback)."""
    tiny = [o for o in TINY_RUN if not o.startswith(("trainer.max_epochs", "data.max_train"))]
    tiny = [o for o in tiny if not o.startswith("callbacks.")]
    sweep = tmp_path / "sweep"
    run(
        "-m",
        "experiment=rank/flow_of_ranks",
        "model=chronos_bolt,patchtst",
        *tiny,
        "callbacks.probe.num_windows=8",
        "callbacks.probe.max_tokens=300",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    study = pd.read_csv(sweep / "analysis" / "study.csv")
    assert set(study["model"]) == {"chronos_bolt", "patchtst"}
    assert set(study["probe"]) == {"rank"}
    assert (sweep / "analysis" / "flow_of_ranks.png").is_file()
    assert "flow of ranks" in (sweep / "analysis" / "report.html").read_text().lower()


def test_final_forecast_pairs_zero_shot_runs_first_epoch_and_trained_runs_last():
    """A grid that pools zero-shot models with one trained from scratch (PatchTST in the
    isotropy paper) correlates each run's last forecast with the geometry of those weights."""
    zero_shot = {"a": (0.1, 3.0), "b": (0.4, 1.0), "c": (0.3, 2.0)}  # run: (cos, before nmse)
    trained = {"d": ([0.9, 0.2], 0.5), "e": ([0.8, 0.6], 4.0)}  # run: (cos per epoch, after)
    rows, runs = [], []
    for run, (value, nmse) in zero_shot.items():
        rows.append({"run": run, "epoch": 0, "global_step": 0, "value": value})
        runs.append({"run": run, "model": "m1", "dataset": run, "before_test_nmse": nmse})
    for run, (values, nmse) in trained.items():
        rows += [
            {"run": run, "epoch": e, "global_step": e, "value": v} for e, v in enumerate(values)
        ]
        runs.append({"run": run, "model": "m2", "dataset": run, "after_test_nmse": nmse})
    table = pd.DataFrame(rows).assign(probe="isotropy", metric="cos_inter", layer="encoder.0")
    run_table = pd.DataFrame(runs)
    add_final_forecast(run_table)
    assert list(run_table["final_test_nmse"]) == [3.0, 1.0, 2.0, 0.5, 4.0]
    study = Study(
        table, run_table, ["after_test_nmse", "before_test_nmse", "final_test_nmse"], pd.DataFrame()
    )
    found = correlations(study, n_boot=50, n_perm=50)
    row = found[
        (found["forecast_metric"] == "final_test_nmse")
        & (found["group"] == "all")
        & (found["layer"] == "last")  # two models pooled: compared by depth
    ].iloc[0]
    expected = stats.spearmanr([0.1, 0.4, 0.3, 0.2, 0.6], [3.0, 1.0, 2.0, 0.5, 4.0]).statistic
    assert row["n"] == 5 and row["spearman"] == pytest.approx(expected)


def test_no_final_forecast_when_every_run_is_zero_shot():
    run_table = pd.DataFrame({"run": ["a", "b"], "before_test_nmse": [1.0, 2.0]})
    add_final_forecast(run_table)
    assert list(run_table.columns) == ["run", "before_test_nmse"]


def fake_run(
    directory: Path, overrides: list[str], summary: dict, seed: int = 0, compression=None
) -> Path:
    """A run directory as run.py leaves it, without probe records (pretraining, compression)."""
    (directory / ".hydra").mkdir(parents=True)
    config = {
        "seed": seed,
        "task": {"name": "pretrain"},
        "model": {"name": "chronos"},
        "data": {"dataset": "kernelsynth/mixed"},
    }
    (directory / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (directory / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (directory / "summary.json").write_text(json.dumps(summary))
    if compression is not None:
        pd.DataFrame(compression).to_csv(directory / "compression.csv", index=False)
    return directory


def test_runs_compared_by_forecast_alone_give_mean_and_sd_over_seeds(tmp_path):
    wql = {("dense", 0): 0.30, ("dense", 1): 0.34, ("flow", 0): 0.20, ("flow", 1): 0.26}
    for i, ((schedule, seed), value) in enumerate(wql.items()):
        fake_run(
            tmp_path / "sweep" / str(i),
            [f"low_rank@model.low_rank={schedule}", f"seed={seed}"],
            {"after": {"test/wql": value}},
            seed=seed,
        )
    out = tmp_path / "analysis"
    run("task=analyze", f"analyze.runs={tmp_path / 'sweep'}", f"hydra.run.dir={out}", cwd=tmp_path)
    table = pd.read_csv(out / "forecast_by_setting.csv").set_index("low_rank")
    assert table.loc["flow", "runs"] == 2
    assert table.loc["flow", "after_test_wql_mean"] == pytest.approx(0.23)
    assert table.loc["dense", "after_test_wql_sd"] == pytest.approx(np.std([0.30, 0.34], ddof=1))
    page = (out / "report.html").read_text()
    assert "no correlations" in page and "mean and sd over seeds" in page


def test_compression_rows_of_every_run_are_gathered_with_the_run_factors(tmp_path):
    rows = {"chronos": [0.9, 0.5], "moirai": [0.8, 0.4]}
    for model, sizes in rows.items():
        directory = fake_run(
            tmp_path / "sweep" / model,
            [f"model={model}"],
            {"task": "compress"},
            compression={
                "epsilon": [0.01, 0.1],
                "attention_size_ratio": sizes,
                "wql_ratio": [1.0, 1.1],
                "nmse_ratio": [1.0, 1.2],
            },
        )
        config = yaml.safe_load((directory / ".hydra" / "config.yaml").read_text())
        config["model"]["name"] = model
        (directory / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    study = load_study([str(tmp_path / "sweep")])
    assert study.unprobed == ["chronos", "moirai"] and not study.left_out
    table = study.compression.set_index(["model", "epsilon"])
    for model, sizes in rows.items():
        assert list(table.loc[model, "attention_size_ratio"]) == sizes


def test_models_are_compared_layer_by_layer_on_the_windows_both_saved(sweep, analysis):
    table = pd.read_csv(analysis / "model_similarity.csv")
    # one pair of runs per data set, chronos_bolt's against patchtst's, at both epoch kinds
    assert set(zip(table.model_a, table.model_b, strict=True)) == {MODELS}
    assert table.groupby("dataset")["run_a"].nunique().eq(1).all()
    compared = 0
    for _, part in table.groupby(["dataset", "epoch_kind"]):
        if part["cka"].notna().any():
            # the probe set's 8 windows are the same (series, forecast origin) for both models:
            # every layer of one against every layer of the other
            assert (part["n_windows"] == 8).all() and part["cka"].notna().all()
            assert part["cka"].between(-1, 1).all()
            assert len(part) == part.layer_a.nunique() * part.layer_b.nunique() > 1
            compared += 1
        else:
            # the models' context lengths cut other validation windows, so their probe sets
            # share fewer than 8: one row for the pair, no value, the reason
            assert len(part) == 1
            assert (
                part["note"]
                .iloc[0]
                .endswith("shared windows (series, forecast origin), fewer than 8")
            )
    assert compared >= 2
    # zero-shot runs: the last probe is epoch 0, so both epoch kinds give the same values
    defined = table[table.cka.notna()]
    kinds = defined.pivot_table(
        index=["dataset", "layer_a", "layer_b"], columns="epoch_kind", values="cka"
    )
    np.testing.assert_array_equal(kinds["epoch0"], kinds["last"])
    assert len(list((analysis / "model_similarity").glob("*.png"))) == 1
    assert "Model against model" in (analysis / "report.html").read_text()
