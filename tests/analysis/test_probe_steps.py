"""``task=analyze`` on the step index: a schedule in steps probes several times per epoch (the
acceptance run probes at steps 0, 4 and 8, the first two in epoch 0), and each probe is one
point of the run's trajectory, its first and last probe chosen by step, and its validation the
one that measured the same weights."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from isoprobe.analysis.correlations import geometry_at
from isoprobe.analysis.study import load_study
from tests.analysis.test_analyze import fake_run

#: (epoch label, step) of each probe, as the probe labels a schedule in steps: the epochs
#: completed, so the probe at the last step of epoch 0 (step 8) is labelled 1
PROBES = ((0, 0), (0, 4), (1, 8), (1, 12))
LAYERS = ("encoder.0", "encoder.1")


def _value(run: int, step: int, layer: int) -> float:
    return 1.0 + run + step / 100 + layer / 1000


def _step_run(directory: Path, run: int) -> Path:
    fake_run(
        directory, [f"seed={run}"], {"before": {"test/nmse": 0.5}, "after": {"test/nmse": 0.4}}
    )
    rows = [
        ("isotropy", epoch, step, layer, "cos_inter", _value(run, step, i), "")
        for epoch, step in PROBES
        for i, layer in enumerate(LAYERS)
    ]
    columns = ["probe", "epoch", "global_step", "layer", "metric", "value", "note"]
    pd.DataFrame(rows, columns=columns).to_csv(directory / "probe_metrics.csv", index=False)
    (directory / "csv").mkdir()
    # Lightning logs the validation after epoch 0 (8 steps) at step 7, the index of its last step
    validation = [
        {"epoch": 0, "step": 3, "train/loss": 1.0},
        {"epoch": 0, "step": 7, "val/nmse": 0.3 + run},
        {"epoch": 1, "step": 11, "train/loss": 0.9},
    ]
    pd.DataFrame(validation).to_csv(directory / "csv" / "metrics.csv", index=False)
    return directory


def test_a_run_probed_several_times_per_epoch_is_read_on_the_step_index(tmp_path):
    for run in range(3):
        _step_run(tmp_path / "sweep" / str(run), run)
    study = load_study([str(tmp_path / "sweep")])
    table = study.table
    assert sorted(table["global_step"].unique()) == [0, 4, 8, 12]

    for when, step in (("before", 0), ("after", 12)):
        wide = geometry_at(study, when)
        for name in study.runs["run"]:
            run = int(Path(name).name)
            for i, layer in enumerate(LAYERS):
                expected = _value(run, step, i)
                assert wide.loc[name, ("isotropy", "cos_inter", layer)] == pytest.approx(expected)

    # the validation after epoch 0 measured the weights of step 8, and only the probe there
    with_validation = table.dropna(subset=["val_nmse"])
    assert set(with_validation["global_step"]) == {8}
    for name, part in with_validation.groupby("run"):
        assert (part["val_nmse"] == 0.3 + int(Path(name).name)).all()
