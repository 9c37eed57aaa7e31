"""probe_metrics: equal to the individual functions, configurable, defined on degenerate input,
invariant where the maths says so."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from omegaconf import OmegaConf

from isoprobe.metrics import (
    ALL_METRICS,
    ProbeMetricsConfig,
    cluster_adjusted_cosine,
    effective_dimension,
    epsilon_rank,
    inter_token_cosine,
    isoscore,
    participation_ratio,
    partition_ratio,
    probe_metrics,
)

ALL_KEYS = {key for keys in ALL_METRICS.values() for key in keys}


def test_every_key_equals_its_individual_function(separated_clusters):
    X, _ = separated_clusters(sizes=(70, 50, 40), d=12, seed=5)
    cfg = ProbeMetricsConfig(ed_threshold=0.9, rank_eps=0.05, seed=2)
    out = probe_metrics(X, cfg)
    assert set(out) == ALL_KEYS and all(type(v) is float for v in out.values())
    clusters = cluster_adjusted_cosine(X, seed=2)
    centred = X - X.mean(0)
    expected = {
        "cos_inter": inter_token_cosine(X),
        "cos_inter_centered": inter_token_cosine(X, center=True),
        "cos_cluster": clusters.value,
        "cos_cluster_baseline": clusters.baseline,
        "cos_cluster_excess": clusters.excess,
        "n_clusters": clusters.k,
        "silhouette": clusters.silhouette,
        "eff_dim": effective_dimension(X, 0.9),
        "participation_ratio": participation_ratio(X),
        "partition_ratio": partition_ratio(X).ratio,
        "log_partition_ratio": partition_ratio(X).log_ratio,
        "isoscore": isoscore(X),
        "eps_rank_centred": epsilon_rank(centred, 0.05),
    }
    for key, value in expected.items():
        assert out[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_selection_and_config_forms(gaussian):
    X = gaussian(60, 5) + 1
    only = probe_metrics(X, {"metrics": ["isoscore", "partition_ratio"]})
    assert set(only) == {"isoscore", "partition_ratio", "log_partition_ratio"}
    hydra_cfg = OmegaConf.create({"metrics": ["eps_rank_centred"], "rank_eps": 0.5, "k_max": 4})
    assert probe_metrics(X, hydra_cfg) == {
        "eps_rank_centred": float(epsilon_rank(X - X.mean(0), 0.5))
    }
    assert ProbeMetricsConfig.from_any(hydra_cfg).metrics == ("eps_rank_centred",)
    assert probe_metrics(X, None) == probe_metrics(X, ProbeMetricsConfig())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"metrics": ["isotropy"]}, "unknown probe metrics"),
        ({"kmax": 4}, "unknown probe metric options"),
        ({"k_min": 5, "k_max": 3}, "k_min <= k_max"),
        ({"ed_threshold": 0.0}, "ed_threshold"),
        ({"rank_eps": 2.0}, "rank_eps"),
        ({"metrics": ["eps_rank"]}, r"\['eps_rank'\] were renamed: write \['eps_rank_centred'\]"),
    ],
)
def test_bad_config_is_refused_with_the_reason(options, message):
    with pytest.raises(ValueError, match=message):
        ProbeMetricsConfig.from_any(options)


def test_too_few_or_non_finite_rows_are_refused(gaussian):
    with pytest.raises(ValueError, match="1 row"):
        probe_metrics(torch.zeros(1, 4))
    X = gaussian(10, 4)
    X[2, 1] = float("nan")
    X[5, 0] = float("inf")
    X[5, 3] = float("nan")
    with pytest.raises(ValueError, match="2 of 10 rows holding NaN/inf"):
        probe_metrics(X)


def test_a_tensor_that_requires_grad_is_measured_as_its_values(gaussian):
    X = gaussian(120, 6, seed=2)
    assert probe_metrics(X.clone().requires_grad_()) == probe_metrics(X)


def test_identical_rows_are_defined():
    x = torch.tensor([0.1, -0.7, 0.3, 2.0], dtype=torch.float64)
    out = probe_metrics(x.expand(20, 4))
    assert out["eff_dim"] == 0 and out["participation_ratio"] == 0 and out["isoscore"] == 0
    assert out["eps_rank_centred"] == 0
    assert out["cos_inter"] == pytest.approx(1.0, abs=1e-14)
    assert math.isnan(out["cos_inter_centered"]) and math.isnan(out["cos_cluster"])
    assert out["n_clusters"] == 1
    assert out["log_partition_ratio"] == pytest.approx(-2 * float(x.norm()), rel=1e-12)


def test_isotropic_gaussian_is_isotropic_by_every_measure(gaussian):
    out = probe_metrics(gaussian(3000, 16, seed=10))
    assert abs(out["cos_inter"]) < 0.01 and abs(out["cos_inter_centered"]) < 0.01
    assert out["isoscore"] > 0.95
    assert out["partition_ratio"] > 0.75  # see test_metrics_partition_ratio
    assert out["n_clusters"] == 1 and out["silhouette"] < 0.1
    assert 12 <= out["eff_dim"] <= 14 and out["eps_rank_centred"] == 16


def test_a_line_is_anisotropic_by_every_measure():
    t = torch.cat([torch.linspace(0.5, 2, 30), -torch.linspace(0.5, 2, 10)]).double()
    X = t[:, None] * torch.tensor([[2.0, -1.0, 0.5, 1.0, 3.0]], dtype=torch.float64)
    out = probe_metrics(X)
    assert out["eff_dim"] == 1 and out["eps_rank_centred"] == 1
    assert out["isoscore"] == pytest.approx(0.0, abs=1e-9)
    assert out["participation_ratio"] == pytest.approx(1.0, abs=1e-9)
    assert out["cos_inter"] == pytest.approx((30 * 29 + 10 * 9 - 2 * 300) / (40 * 39), abs=1e-14)


def test_negation_and_row_order_change_nothing(separated_clusters):
    X, _ = separated_clusters(sizes=(60, 45, 30), d=10, seed=7)
    reference = probe_metrics(X)
    perm = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(8))
    for other in (probe_metrics(-X), probe_metrics(X[perm])):
        assert set(other) == set(reference)
        for key, value in reference.items():
            assert other[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_callers_on_several_threads_get_the_one_at_a_time_values(separated_clusters, gaussian):
    """probe_metrics keeps no state between calls: concurrent callers get exactly their own
    matrix's values."""
    clouds = [separated_clusters(sizes=(60, 40), d=8, seed=s)[0] for s in range(3)]
    clouds += [gaussian(90, 6) * 10**s for s in range(3)]
    alone = [probe_metrics(X) for X in clouds]
    with ThreadPoolExecutor(max_workers=len(clouds)) as callers:
        together = list(callers.map(probe_metrics, clouds))
    assert together == alone


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_every_value_equals_the_cpu_value(separated_clusters):
    X, _ = separated_clusters(sizes=(300, 200, 100), d=32, seed=3)
    on_cpu, on_cuda = probe_metrics(X), probe_metrics(X.cuda())
    assert on_cuda["n_clusters"] == on_cpu["n_clusters"]
    for key, value in on_cpu.items():
        assert on_cuda[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
