"""The fast metrics of isoprobe.metrics equal the plain definitions in metrics.reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from isoprobe import metrics
from isoprobe.metrics import reference


def clouds(gaussian, separated_clusters) -> dict[str, np.ndarray]:
    scales = torch.logspace(0, -2, 16, dtype=torch.float64)
    return {
        "anisotropic": (gaussian(600, 16, seed=1, scales=scales) + 3.0).numpy(),
        "isotropic": gaussian(800, 12, seed=2).numpy(),
        "clusters": separated_clusters()[0].numpy(),
    }


@pytest.fixture
def every_cloud(gaussian, separated_clusters):
    return clouds(gaussian, separated_clusters)


def test_spectral_metrics_equal_their_definitions(every_cloud):
    for name, X in every_cloud.items():
        tokens = torch.as_tensor(X)
        assert metrics.inter_token_cosine(tokens) == pytest.approx(
            reference.inter_token_cosine(X), abs=1e-12
        ), name
        for threshold in (0.5, 0.8, 0.95):
            assert metrics.effective_dimension(tokens, threshold) == (
                reference.effective_dimension(X, threshold)
            ), (name, threshold)
        assert metrics.participation_ratio(tokens) == pytest.approx(
            reference.participation_ratio(X), rel=1e-10
        ), name
        assert metrics.isoscore(tokens) == pytest.approx(reference.isoscore(X), abs=1e-10), name
        assert metrics.partition_ratio(tokens).ratio == pytest.approx(
            reference.partition_ratio(X), rel=1e-8, abs=1e-300
        ), name


def test_cluster_adjusted_cosine_equals_the_authors_computation(separated_clusters):
    X, truth = separated_clusters()
    fast = metrics.cluster_adjusted_cosine(X, k_min=2, k_max=8)
    value, k, silhouette = reference.cluster_adjusted_cosine(X.numpy(), k_min=2, k_max=8)
    assert fast.k == k == len(set(truth))
    assert fast.value == pytest.approx(value, abs=1e-10)
    assert fast.silhouette == pytest.approx(silhouette, abs=1e-10)


def test_epsilon_rank_equals_its_definition():
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.normal(size=(40, 8)))
    V, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    M = U * np.array([9.0, 4.0, 1.3, 0.6, 0.07, 0.012, 0.004, 0.0]) @ V.T
    for eps in (1e-3, 1e-2, 1e-1):
        assert metrics.epsilon_rank(torch.as_tensor(M), eps) == reference.epsilon_rank(M, eps)
