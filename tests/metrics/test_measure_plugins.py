"""A measure in the user's own module loads by config (callbacks.probe.plugins), and its
registration's metadata reaches the run's summary table and the trajectory plot's scale: no
metric name is written anywhere else."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from isoprobe.errors import IsoprobeError
from isoprobe.metrics import metric_info, metrics_where, probe_metrics, unregister_measure
from isoprobe.probing import ProbeCallback
from isoprobe.tasks.summary import format_summary

PLUGIN = textwrap.dedent(
    """
    from isoprobe.metrics import MetricInfo, Tokens, register_measure


    @register_measure("stable_rank", info=MetricInfo(direction=1, summary=True, log_scale=True))
    def _stable_rank(tokens: Tokens) -> dict[str, float]:
        return {"stable_rank": float(tokens.eigenvalues.sum() / tokens.eigenvalues[0])}
    """
)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    (tmp_path / "my_measures.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_measures"
    unregister_measure("stable_rank")
    sys.modules.pop("my_measures", None)


def test_a_plugin_module_by_config_adds_a_measure_and_its_metadata(plugin, tmp_path):
    probe = ProbeCallback(plugins=[plugin], output_dir=str(tmp_path))
    assert "stable_rank" in probe.measure_sets["isotropy"].metrics_config.metrics
    X = torch.randn(50, 4, dtype=torch.float64) * torch.tensor([4.0, 2.0, 1.0, 1.0])
    eigenvalues = torch.linalg.eigvalsh(torch.cov(X.T, correction=0)).flip(0)
    expected = float(eigenvalues.sum() / eigenvalues[0])
    assert probe_metrics(X)["stable_rank"] == pytest.approx(expected, rel=1e-10)
    assert metric_info("stable_rank").log_scale and metric_info("stable_rank").direction == 1
    assert "stable_rank" in metrics_where("summary")
    records = [
        {"epoch": 0, "global_step": 0, "layer": "embed", "metric": "stable_rank", "value": 2.5}
    ]
    assert format_summary(records, None, None).splitlines()[1].split() == ["layer", "stable_rank"]


def test_the_built_in_metadata_is_declared_beside_each_measure():
    assert metrics_where("summary") == (
        "cos_inter",
        "cos_cluster_excess",
        "eff_dim",
        "partition_ratio",
        "isoscore",
        "rank_uncentred_eps0.01",
        "readout_nmse",
        "cka_drift",
    )
    assert metric_info("partition_ratio").log_scale and metric_info("n_tokens").bookkeeping
    assert metric_info("rank_q_eps0.001").direction == 1  # the rank probe's pattern
    assert metric_info("readout_nmse").direction == -1
    assert metric_info("an_unknown_key") == metric_info("another")  # the default


def test_a_plugin_module_that_cannot_be_imported_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(
        IsoprobeError, match=r"callbacks.probe.plugins: cannot import .*'no_such_measures'"
    ):
        ProbeCallback(plugins=["no_such_measures"], output_dir=str(tmp_path))
