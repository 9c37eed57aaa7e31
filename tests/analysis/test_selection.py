"""Label-free selection on constructed studies: exact ρ and top-1 where the answer is known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from isoprobe.analysis.selection import epochs_of_a_run, models_on_a_data_set
from isoprobe.analysis.study import Study

ERRORS = {
    "d1": [1.0, 2.0, 3.0, 4.0],
    "d2": [4.0, 1.0, 3.0, 2.0],
    "d3": [2.0, 3.0, 1.0, 4.0],
    "d4": [3.0, 4.0, 2.0, 1.0],
}


def grid(metric_of_error) -> Study:
    """Four models on four data sets; each run's last-block metric is metric_of_error(d, e)."""
    rows, runs = [], []
    for dataset, errors in ERRORS.items():
        for i, error in enumerate(errors):
            run = f"{dataset}/m{i}"
            runs.append(
                {"run": run, "model": f"m{i}", "dataset": dataset, "before_test_nmse": error}
            )
            for name, value in metric_of_error(dataset, error).items():
                rows.append(
                    {
                        "run": run,
                        "probe": "isotropy",
                        "epoch": 0,
                        "global_step": 0,
                        "layer": "encoder.0",
                        "metric": name,
                        "value": value,
                    }
                )
    return Study(pd.DataFrame(rows), pd.DataFrame(runs), ["before_test_nmse"], pd.DataFrame())


def row(summary: pd.DataFrame, metric: str, layer: str = "last") -> pd.Series:
    return summary[(summary["metric"] == metric) & (summary["layer"].isin([layer, ""]))].iloc[0]


def test_a_metric_that_orders_the_models_as_their_errors_selects_the_best_either_sign():
    summary = models_on_a_data_set(grid(lambda d, e: {"up": 2 * e, "down": -e}), "before_test_nmse")
    for metric in ("up", "down"):
        found = row(summary, metric)
        assert found["tasks"] == 4
        assert found["spearman"] == pytest.approx(1.0) and found["top1"] == 1.0
    random = row(summary, "random")
    assert random["spearman"] == 0.0 and random["top1"] == pytest.approx(0.25)


def test_the_direction_comes_from_the_other_data_sets_not_the_labels_being_predicted():
    """d1's metric runs against its errors while the others run with theirs: d1 is predicted
    with the others' direction, so it scores ρ = -1 and picks its worst model."""
    summary = models_on_a_data_set(
        grid(lambda d, e: {"flip": -e if d == "d1" else e}), "before_test_nmse"
    )
    found = row(summary, "flip")
    assert found["spearman"] == pytest.approx((-1 + 1 + 1 + 1) / 4)
    assert found["top1"] == pytest.approx(3 / 4)


def test_a_metric_whose_sign_differs_between_data_sets_selects_against_itself():
    flipped = {"d1", "d2"}
    summary = models_on_a_data_set(
        grid(lambda d, e: {"split": -e if d in flipped else e}), "before_test_nmse"
    )
    # every data set sees the others at mean rho -1/3 or +1/3: a direction, against its own
    found = row(summary, "split")
    assert found["spearman"] == pytest.approx(-1.0) and found["top1"] == 0.0


def test_epochs_of_each_run_are_ranked_by_their_validation_error():
    rows = []
    for run, val in (("a", [5.0, 3.0, 4.0, 1.0]), ("b", [2.0, 4.0, 1.0, 3.0])):
        for epoch, error in enumerate(val):
            rows.append(
                {
                    "run": run,
                    "probe": "isotropy",
                    "epoch": epoch,
                    "global_step": epoch,
                    "layer": "encoder.0",
                    "metric": "cos_inter",
                    "value": 10 * error,
                    "val_nmse": error,
                }
            )
    runs = pd.DataFrame({"run": ["a", "b"], "model": "m", "dataset": "d"})
    summary = epochs_of_a_run(Study(pd.DataFrame(rows), runs, [], pd.DataFrame()))
    found = row(summary, "cos_inter")
    assert found["tasks"] == 2 and found["spearman"] == pytest.approx(1.0)
    assert found["top1"] == 1.0 and row(summary, "random")["top1"] == pytest.approx(0.25)
    assert np.isfinite(summary["spearman"]).all()


def test_geometry_change_per_swept_setting_over_the_runs_that_trained():
    from isoprobe.analysis.tables import geometry_change

    moves = {("lora", "a"): 0.1, ("lora", "b"): -0.3, ("full", "c"): 0.5, ("full", "d"): 0.7}
    rows, runs = [], []
    for (strategy, run), move in moves.items():
        runs.append({"run": run, "model": "m", "dataset": "d", "model.adapt": strategy})
        for epoch, value in ((0, 1.0), (1, 1.0 + move / 2), (2, 1.0 + move)):
            for layer in ("encoder.0", "encoder.1"):
                rows.append(
                    {
                        "run": run,
                        "probe": "isotropy",
                        "epoch": epoch,
                        "global_step": epoch,
                        "layer": layer,
                        "metric": "cos_inter",
                        "value": value if layer == "encoder.1" else 0,
                    }
                )
    study = Study(pd.DataFrame(rows), pd.DataFrame(runs), [], pd.DataFrame())
    table = geometry_change(study).set_index("model.adapt")
    assert table.loc["lora", "runs"] == 2
    assert table.loc["lora", "mean_change"] == pytest.approx(-0.1)
    assert table.loc["lora", "mean_abs_change"] == pytest.approx(0.2)
    assert table.loc["full", "mean_abs_change"] == pytest.approx(0.6)


def test_settings_that_follow_from_the_data_set_are_not_swept_settings():
    """An adaptation sweep over domains: the strategy is swept; the ``data`` override and the
    domain's context length change with the data set and are not compared as settings; a
    context length swept on one data set is."""
    from isoprobe.analysis.tables import swept_settings

    runs = pd.DataFrame(
        [
            {"run": f"{s}-{d}", "model": "m", "dataset": d, "data": f"domain_{d}",
             "context_length": length, "model.adapt": s}
            for s in ("full", "lora")
            for d, length in (("d1", 144), ("d2", 36))
        ]
    )  # fmt: skip
    study = Study(pd.DataFrame(), runs, [], pd.DataFrame())
    assert swept_settings(study) == ["model.adapt"]
    one_set = runs[runs["dataset"] == "d1"].assign(context_length=[144, 96])
    assert swept_settings(Study(pd.DataFrame(), one_set, [], pd.DataFrame())) == [
        "context_length",
        "model.adapt",
    ]


def test_one_data_set_gives_no_selection_since_no_direction_can_be_learned():
    one = {"d1": ERRORS["d1"]}
    rows, runs = [], []
    for dataset, errors in one.items():
        for i, error in enumerate(errors):
            runs.append(
                {"run": f"m{i}", "model": f"m{i}", "dataset": dataset, "before_test_nmse": error}
            )
            rows.append(
                {
                    "run": f"m{i}",
                    "probe": "isotropy",
                    "epoch": 0,
                    "global_step": 0,
                    "layer": "encoder.0",
                    "metric": "cos_inter",
                    "value": error,
                }
            )
    study = Study(pd.DataFrame(rows), pd.DataFrame(runs), ["before_test_nmse"], pd.DataFrame())
    assert models_on_a_data_set(study, "before_test_nmse").empty
