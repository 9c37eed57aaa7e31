"""isoprobe.metrics against independent numpy / scikit-learn / IsoScore computations on point
clouds whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from IsoScore import IsoScore
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score, silhouette_score

from isoprobe.metrics import (
    ProbeMetricsConfig,
    cluster_adjusted_cosine,
    effective_dimension,
    epsilon_rank,
    inter_token_cosine,
    isoscore,
    participation_ratio,
    partition_ratio,
    probe_metrics,
    silhouettes,
    singular_values,
)


def gaussian(n: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def clusters(n_per: int = 150, d: int = 32, k: int = 4, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g, dtype=torch.float64) * 20
    X = torch.cat([c + torch.randn(n_per, d, generator=g, dtype=torch.float64) for c in centres])
    return X, np.repeat(np.arange(k), n_per)


def brute_force_cosine(X: np.ndarray) -> float:
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    C = U @ U.T
    n = len(X)
    return (C.sum() - np.trace(C)) / (n * (n - 1))


def test_inter_token_cosine_equals_brute_force_mean_over_pairs():
    X = gaussian(300, 16) + 0.7
    assert inter_token_cosine(X) == pytest.approx(brute_force_cosine(X.numpy()), abs=1e-12)
    centred = (X - X.mean(0)).numpy()
    assert inter_token_cosine(X, center=True) == pytest.approx(brute_force_cosine(centred), abs=1e-12)


def test_inter_token_cosine_of_a_ray_is_one_and_zero_rows_are_left_out():
    X = torch.arange(1, 11, dtype=torch.float64)[:, None] * torch.tensor([[1.0, 2.0, -3.0]])
    X = torch.cat([X, torch.zeros(3, 3, dtype=torch.float64)])
    assert inter_token_cosine(X) == pytest.approx(1.0, abs=1e-12)
    assert math.isnan(inter_token_cosine(torch.zeros(5, 3)))


def test_isotropic_gaussian_is_isotropic_by_every_measure():
    out = probe_metrics(gaussian(4000, 16))
    assert abs(out["cos_inter"]) < 0.01
    assert out["isoscore"] > 0.95
    assert out["partition_ratio"] > 0.5
    assert out["n_clusters"] == 1  # no cluster structure: silhouettes stay below 0.1
    assert out["eff_dim"] >= 12


def test_rank_one_line_has_one_dimension_and_zero_isoscore():
    t = torch.linspace(-1, 1, 200, dtype=torch.float64)[:, None]
    X = t * torch.randn(1, 24, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert effective_dimension(X) == 1
    assert participation_ratio(X) == pytest.approx(1.0, abs=1e-9)
    assert isoscore(X) == pytest.approx(0.0, abs=1e-9)
    assert epsilon_rank(X, 1e-6) == 1


def test_spectral_measures_agree_with_numpy_covariance_eigenvalues():
    X = gaussian(500, 20) @ torch.diag(torch.logspace(0, -2, 20, dtype=torch.float64))
    lam = np.sort(np.linalg.eigvalsh(np.cov(X.numpy(), rowvar=False)))[::-1]
    for threshold in (0.5, 0.8, 0.95):
        expected = int(np.searchsorted(np.cumsum(lam) / lam.sum(), threshold) + 1)
        assert effective_dimension(X, threshold) == expected
    assert participation_ratio(X) == pytest.approx(lam.sum() ** 2 / (lam**2).sum(), rel=1e-10)


@pytest.mark.parametrize("scale", [0.2, 1.0, 5.0])
def test_isoscore_agrees_with_the_isoscore_package(scale):
    X = gaussian(800, 10) @ torch.diag(torch.linspace(1, scale, 10, dtype=torch.float64))
    reference = float(IsoScore.IsoScore(X.numpy()))  # rows = samples
    assert isoscore(X) == pytest.approx(reference, abs=1e-6)  # the package rounds via float32


def test_partition_ratio_survives_huge_norms_and_matches_shifted_numpy():
    X = gaussian(200, 6) * 1e4 + 3e4  # exp(<c, x>) overflows float64 by hundreds of orders
    result = partition_ratio(X)
    assert math.isfinite(result.log_ratio) and result.log_ratio <= 0
    _, V = np.linalg.eigh(X.numpy().T @ X.numpy())
    P = X.numpy() @ np.concatenate([V, -V], axis=1)
    peak = P.max(axis=0)
    log_z = peak + np.log(np.exp(P - peak).sum(axis=0))
    assert result.log_ratio == pytest.approx(log_z.min() - log_z.max(), rel=1e-9)


def test_partition_ratio_is_invariant_to_negation_and_row_order():
    X = gaussian(300, 8) + torch.tensor([2.0] + [0.0] * 7, dtype=torch.float64)
    a = partition_ratio(X).log_ratio
    assert partition_ratio(-X).log_ratio == pytest.approx(a, rel=1e-9)
    assert partition_ratio(X[torch.randperm(300)]).log_ratio == pytest.approx(a, rel=1e-9)


def test_well_separated_clusters_match_sklearn_kmeans_and_silhouette():
    X, truth = clusters()
    ours = cluster_adjusted_cosine(X)
    centred = (X - X.mean(0)).numpy()
    scores = {}
    labels = {}
    for k in range(2, 17):
        labels[k] = KMeans(n_clusters=k, random_state=42).fit_predict(centred)
        scores[k] = silhouette_score(centred, labels[k])
    best = max(scores, key=scores.get)
    assert ours.k == best == 4
    assert adjusted_rand_score(ours.labels.numpy(), labels[best]) == 1.0
    assert adjusted_rand_score(ours.labels.numpy(), truth) == 1.0
    assert ours.silhouette == pytest.approx(scores[best], abs=1e-6)
    ref = np.mean(
        [brute_force_cosine(centred[labels[best] == c] - centred[labels[best] == c].mean(0)) for c in range(best)]
    )
    assert ours.value == pytest.approx(ref, abs=1e-3)
    assert ours.sizes == (150, 150, 150, 150)
    assert ours.baseline == pytest.approx(-1 / 149)


def test_silhouettes_match_sklearn_for_arbitrary_labelings():
    X = gaussian(400, 5)
    rng = np.random.default_rng(0)
    labelings = [torch.as_tensor(rng.integers(0, k, 400)) for k in (2, 3, 7)]
    ours = silhouettes(X, labelings)
    for lab, value in zip(labelings, ours):
        assert value == pytest.approx(silhouette_score(X.numpy(), lab.numpy()), abs=1e-10)


def test_fewer_tokens_than_k_max_lowers_k_max():
    X, _ = clusters(n_per=3, k=3)
    result = cluster_adjusted_cosine(X, k_max=16)
    assert result.k == 3
    assert int(result.labels.max()) + 1 == 3


def test_epsilon_rank_counts_singular_values_above_the_relative_threshold():
    Q1, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(30, 30)))
    Q2, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(20, 20)))
    sigma = np.array([10, 5, 1, 0.5, 0.09, 0.011, 0.009] + [0.0] * 13)
    M = torch.as_tensor(Q1[:, :20] * sigma @ Q2)
    assert torch.allclose(singular_values(M), torch.as_tensor(sigma), atol=1e-12)
    assert epsilon_rank(M, 1e-1) == 3  # 10, 5, 1
    assert epsilon_rank(M, 1e-2) == 4  # + 0.5
    assert epsilon_rank(M, 1e-3) == 6  # + 0.09, 0.011; not 0.009


def test_degenerate_inputs_are_defined():
    with pytest.raises(ValueError, match="1 row"):
        probe_metrics(torch.zeros(1, 4))
    X = gaussian(10, 4)
    X[2, 1] = float("nan")
    X[5, 0] = float("inf")
    with pytest.raises(ValueError, match="2 of 10 rows holding NaN/inf"):
        probe_metrics(X)
    same = torch.ones(20, 4, dtype=torch.float64) * 3
    out = probe_metrics(same)
    assert out["eff_dim"] == 0 and out["participation_ratio"] == 0 and out["isoscore"] == 0
    assert math.isnan(out["cos_cluster"]) and math.isnan(out["cos_inter_centered"])
    assert math.isfinite(out["log_partition_ratio"])  # computed as usual on the uncentred rows


def test_probe_metrics_equals_the_individual_functions_and_honours_the_selection():
    X, _ = clusters(n_per=60, d=12, k=3, seed=5)
    X = X + 4
    out = probe_metrics(X)
    assert out["cos_inter"] == pytest.approx(inter_token_cosine(X), abs=1e-12)
    assert out["eff_dim"] == effective_dimension(X)
    assert out["isoscore"] == pytest.approx(isoscore(X), abs=1e-12)
    assert out["log_partition_ratio"] == pytest.approx(partition_ratio(X).log_ratio, rel=1e-10)
    cc = cluster_adjusted_cosine(X)
    assert out["cos_cluster"] == pytest.approx(cc.value, abs=1e-12) and out["n_clusters"] == cc.k
    assert out["cos_cluster_excess"] == pytest.approx(cc.value - cc.baseline, abs=1e-12)
    only = probe_metrics(X, {"metrics": ["isoscore", "eps_rank"], "rank_eps": 0.1})
    assert set(only) == {"isoscore", "eps_rank"}
    assert only["eps_rank"] == epsilon_rank(X - X.mean(0), 0.1)
    with pytest.raises(ValueError, match="unknown probe metrics"):
        ProbeMetricsConfig(metrics=("isotropy",))
