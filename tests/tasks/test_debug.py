"""`debug=fdr` is a quick smoke run: every experiment goes through it without loggers or probes."""

from __future__ import annotations

import pytest

from isoprobe.tasks import run_task
from tests.conftest import CONFIG_DIR, compose_config

EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("experiment", [None, *EXPERIMENTS])
def test_every_experiment_runs_under_fast_dev_run_without_logger_or_probe(tmp_path, experiment):
    overrides = ["debug=fdr", "trainer.enable_progress_bar=false"]
    if experiment is not None:
        overrides.append(f"experiment={experiment}")
    cfg = compose_config(tmp_path, overrides)
    assert cfg.trainer.fast_dev_run is True
    results = run_task(cfg)
    assert "test/nmse" in results["after"]
    assert results["probe_records"] == []
    written = {p.name for p in tmp_path.iterdir()}
    assert not written & {"probe_metrics.csv", "wandb", "csv", "checkpoints"}


def test_the_probe_skips_fast_dev_run_even_when_configured(tiny_config, tmp_path):
    results = run_task(tiny_config("+trainer.fast_dev_run=true", "model.checkpoint=scratch"))
    assert results["probe_records"] == []
    assert not (tmp_path / "probe_metrics.csv").exists()
