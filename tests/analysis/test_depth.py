"""Per-layer geometry against per-layer readout error (inside each run, combined), and drift
against the forecast gain of fine-tuning, on a constructed study with planted associations."""

from __future__ import annotations

import numpy as np
import pandas as pd

from isoprobe.analysis.depth import drift_against_gain, geometry_against_readout
from isoprobe.analysis.independence import SHARED_WEIGHTS
from isoprobe.analysis.study import Study
from isoprobe.metrics.rank import rank_metric

WEIGHT_METRIC = rank_metric(0.01, "q")


def _study(rng: np.random.Generator) -> Study:
    """12 runs of 2 models, 4 blocks, probed at epochs 0 and 1: ``isoscore`` rises with the
    readout error across a run's layers (each run at its own level), ``eff_dim`` is noise, the
    readout's skill mirrors its error (a forecast measure, not geometry), and the last block's
    drift follows the run's gain."""
    runs, table = [], []
    for i in range(12):
        run, before = f"run{i}", float(rng.uniform(0.5, 1.0))
        gain = float(rng.uniform(0.0, 0.5))
        runs.append(
            {
                "run": run,
                "model": f"m{i % 2}",
                "dataset": "d",
                "before_test_nmse": before,
                "after_test_nmse": before * (1 - gain),
            }
        )
        level = rng.uniform(-5, 5)
        for epoch in (0, 1):
            for block in range(4):
                layer = f"encoder.{block}"
                error = float(rng.uniform())
                values = {
                    "readout_nmse": error,
                    "readout_skill": 1.0 - error,
                    "isoscore": level + error + 0.01 * rng.normal(),
                    "eff_dim": rng.uniform(),
                    "cka_drift": 0.0 if epoch == 0 else gain * (block + 1) + 0.01 * rng.normal(),
                }
                table += [
                    {
                        "run": run,
                        "probe": "isotropy",
                        "epoch": epoch,
                        "global_step": 10 * epoch,
                        "layer": layer,
                        "metric": metric,
                        "value": value,
                    }
                    for metric, value in values.items()
                ]
    forecasts = ["before_test_nmse", "after_test_nmse"]
    return Study(pd.DataFrame(table), pd.DataFrame(runs), forecasts, pd.DataFrame())


def test_geometry_against_readout_finds_the_within_run_association():
    found = geometry_against_readout(_study(np.random.default_rng(0)), n_perm=500)
    by_metric = found.set_index("metric")
    # the readout's own measures are the other side of the association, not geometry
    assert set(by_metric.index) == {"isoscore", "eff_dim", "cka_drift"}
    assert by_metric.at["isoscore", "spearman_within_run"] > 0.95
    assert by_metric.at["isoscore", "pairs"] == 48 and by_metric.at["isoscore", "runs"] == 12
    assert by_metric.at["isoscore", "q_value"] < 0.01
    assert by_metric.at["eff_dim", "p_value"] > 0.01


def test_drift_follows_the_forecast_gain():
    found = drift_against_gain(_study(np.random.default_rng(1)), n_perm=500)
    last = found.set_index("layer").loc["last"]
    assert last["forecast_gain"] == "gain_test_nmse" and last["n"] == 12
    assert last["spearman"] > 0.9 and last["spearman_within_model"] > 0.9
    assert last["q_value"] < 0.01


def test_a_weight_measure_across_runs_that_share_weights_is_not_combined():
    """Twelve zero-shot runs of two models: each model's ε-rank of a projection is the same in
    its six runs, which are one observation of those weights, not six strata."""
    study = _study(np.random.default_rng(1))
    last = study.table["epoch"] == 1
    study.table = study.table[~last].reset_index(drop=True)  # zero-shot: one probe, epoch 0
    weights = [
        {
            "run": run,
            "probe": "rank",
            "epoch": 0,
            "global_step": 0,
            "layer": f"encoder.{block}",
            "metric": WEIGHT_METRIC,
            "value": 10.0 + 3 * block + int(model[1:]),
        }
        for run, model in zip(study.runs["run"], study.runs["model"], strict=True)
        for block in range(4)
    ]
    study.table = pd.concat([study.table, pd.DataFrame(weights)], ignore_index=True)
    by_metric = geometry_against_readout(study, n_perm=200).set_index("metric")
    assert by_metric.at[WEIGHT_METRIC, "undefined"] == SHARED_WEIGHTS
    assert np.isnan(
        by_metric.loc[WEIGHT_METRIC, ["spearman_within_run", "p_value", "q_value"]].astype(float)
    ).all()
    assert pd.isna(by_metric.at["isoscore", "undefined"])
    assert by_metric.at["isoscore", "q_value"] < 0.01
