"""Every configs/model/*.yaml through the runner, as `python run.py model=<name>` would run it:
a short fine-tune probes every layer before training and after its epoch and evaluates before and
after; `task=probe` probes the model once, zero-shot, without training."""

from __future__ import annotations

import pandas as pd
import pytest

from isoprobe.tasks import run_task
from tests.conftest import CONFIG_DIR

MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
SHORT = ["model.checkpoint=scratch", "data.max_train_windows=32", "data.max_eval_windows=8"]


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_fine_tuning_probes_every_layer_before_and_after_the_epoch(tiny_config, tmp_path, name):
    results = run_task(tiny_config(*SHORT, model=name))
    records = pd.read_csv(tmp_path / "probe_metrics.csv")
    assert sorted(records.epoch.unique()) == [0, 1]
    by_epoch = records.groupby("epoch").layer.apply(set)
    assert by_epoch[0] == by_epoch[1] and "embed" in by_epoch[0]
    assert records.value.notna().any()
    for split in ("before", "after"):
        assert {"test/nmse", "test/mase", "test/wql"} <= set(results[split]), split
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_the_probe_task_probes_once_without_training(tiny_config, tmp_path, name):
    results = run_task(tiny_config(*SHORT, "task=probe", model=name))
    records = pd.read_csv(tmp_path / "probe_metrics.csv")
    assert records.epoch.unique().tolist() == [0] and records.global_step.eq(0).all()
    assert "after" not in results and "test/nmse" in results["before"]
    assert not (tmp_path / "checkpoints").exists()
