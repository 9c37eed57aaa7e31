"""cluster_adjusted_cosine against the isotropy authors' computation (sklearn KMeans with
random_state=42 + silhouette_score for k = 2..16 on the globally centred tokens), and on clouds
whose within-cluster cosine is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score, silhouette_score

from isoprobe.metrics import cluster_adjusted_cosine, inter_token_cosine


def sklearn_reference(X: torch.Tensor, brute_force_cosine) -> tuple[int, float, np.ndarray, float]:
    """(k, best silhouette, labels, cluster cosine) as the authors compute them."""
    centred = (X - X.mean(0)).numpy()
    best_k, best_score, best_labels = 0, -np.inf, None
    for k in range(2, 17):
        labels = KMeans(n_clusters=k, random_state=42).fit_predict(centred)
        score = silhouette_score(centred, labels)
        if score > best_score:
            best_k, best_score, best_labels = k, score, labels
    value = np.mean(
        [
            brute_force_cosine(centred[best_labels == c] - centred[best_labels == c].mean(0))
            for c in range(best_k)
        ]
    )
    return best_k, float(best_score), best_labels, float(value)


def test_separated_clusters_agree_with_the_authors_sklearn_computation(
    separated_clusters, brute_force_cosine
):
    X, truth = separated_clusters()
    ours = cluster_adjusted_cosine(X)
    k, silhouette, labels, value = sklearn_reference(X, brute_force_cosine)
    assert ours.k == k == 4
    assert adjusted_rand_score(ours.labels.numpy(), labels) == 1.0
    assert adjusted_rand_score(ours.labels.numpy(), truth) == 1.0
    assert ours.silhouette == pytest.approx(silhouette, abs=1e-9)
    assert ours.value == pytest.approx(value, abs=1e-3)
    assert ours.value == pytest.approx(value, abs=1e-12)  # same partition: same number
    assert sorted(ours.sizes) == [80, 120, 150, 200]
    assert ours.baseline == pytest.approx(np.mean([-1 / (n - 1) for n in ours.sizes]), abs=1e-15)
    assert ours.excess == ours.value - ours.baseline


def test_unstructured_cloud_falls_back_to_one_cluster_like_sklearn(gaussian, brute_force_cosine):
    X = gaussian(300, 32, seed=9) + 3.0  # in few dimensions k-means silhouettes reach 0.1
    ours = cluster_adjusted_cosine(X)
    _, silhouette, _, _ = sklearn_reference(X, brute_force_cosine)
    assert silhouette < 0.1 and ours.silhouette < 0.1
    assert ours.k == 1 and ours.sizes == (300,)
    assert torch.equal(ours.labels, torch.zeros(300, dtype=torch.long))
    assert ours.value == pytest.approx(inter_token_cosine(X, center=True), abs=1e-14)
    assert ours.baseline == pytest.approx(-1 / 299, abs=1e-15)


def test_equal_norm_clusters_sit_exactly_on_the_baseline():
    # Each cluster is centre +- r e_i: its centred members have equal norms and sum to zero,
    # so their mean cosine is exactly -1/(n_c - 1) (the sample-size baseline).
    d = 5
    cross = torch.cat([torch.eye(d), -torch.eye(d)]).double()
    centres = torch.tensor([[40.0] * d, [-40.0] * d, [40.0, -40.0] + [0.0] * (d - 2)])
    X = torch.cat([c + r * cross for c, r in zip(centres, (1.0, 2.0, 0.5), strict=True)])
    result = cluster_adjusted_cosine(X)
    assert result.k == 3
    assert result.value == pytest.approx(-1 / (2 * d - 1), abs=1e-14)
    assert result.excess == pytest.approx(0.0, abs=1e-14)


def test_clusters_of_identical_rows_are_left_out(brute_force_cosine):
    g = torch.Generator().manual_seed(4)
    spread = torch.randn(40, 3, generator=g, dtype=torch.float64) + 30.0
    X = torch.cat([torch.zeros(10, 3, dtype=torch.float64), spread])
    result = cluster_adjusted_cosine(X)
    assert result.k == 2
    assert sorted(result.sizes) == [10, 40]
    assert result.value == pytest.approx(brute_force_cosine((spread - spread.mean(0)).numpy()))
    assert result.baseline == pytest.approx(-1 / 39)


def test_fewer_tokens_than_k_max_lowers_k_max():
    g = torch.Generator().manual_seed(5)
    centres = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    X = centres.repeat_interleave(3, dim=0) + 0.1 * torch.randn(9, 2, generator=g).double()
    result = cluster_adjusted_cosine(X, k_max=16)  # 9 rows: k = 2..8 tried
    assert result.k == 3 and result.sizes == (3, 3, 3)
    two = cluster_adjusted_cosine(X[[0, 4]])  # no k fits in two rows: one cluster
    assert two.k == 1 and math.isnan(two.silhouette)
    assert two.value == pytest.approx(-1.0, abs=1e-14)  # two centred rows point apart


def test_row_order_and_negation_do_not_change_the_result(separated_clusters):
    X, _ = separated_clusters(sizes=(90, 60, 40), d=12, seed=3)
    reference = cluster_adjusted_cosine(X)
    perm = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(6))
    shuffled = cluster_adjusted_cosine(X[perm])
    negated = cluster_adjusted_cosine(-X)
    for other, labels in ((shuffled, reference.labels[perm]), (negated, reference.labels)):
        assert other.k == reference.k == 3
        assert adjusted_rand_score(other.labels.numpy(), labels.numpy()) == 1.0
        assert other.value == pytest.approx(reference.value, abs=1e-12)
        assert other.silhouette == pytest.approx(reference.silhouette, abs=1e-12)


def test_bad_k_range_is_refused(gaussian):
    with pytest.raises(ValueError, match="k_min <= k_max"):
        cluster_adjusted_cosine(gaussian(20, 2), k_min=5, k_max=3)
    with pytest.raises(ValueError, match="k_min <= k_max"):
        cluster_adjusted_cosine(gaussian(20, 2), k_min=1)
