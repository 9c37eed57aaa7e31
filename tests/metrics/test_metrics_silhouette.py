"""silhouette_scores of many labelings at once against sklearn.metrics.silhouette_score."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import silhouette_score

from isoprobe.metrics import silhouette_scores
from isoprobe.metrics.gram import gram_matrix, pairwise_distances_


def labelings(X: torch.Tensor) -> torch.Tensor:
    """Random 3 clusters; one with a singleton cluster; one with an empty label; the sign of
    the first coordinate (a labeling with real structure)."""
    n = X.shape[0]
    rng = np.random.default_rng(0)
    random_3 = rng.integers(0, 3, n)
    with_singleton = rng.integers(0, 5, n)
    with_singleton[with_singleton == 4] = 3
    with_singleton[17] = 4  # row 17 alone in cluster 4: silhouette 0
    with_gap = rng.integers(0, 2, n) * 2  # labels 0 and 2, cluster 1 empty
    by_sign = (X[:, 0] > 0).long().numpy()
    return torch.as_tensor(np.stack([random_3, with_singleton, with_gap, by_sign], 1))


@pytest.mark.parametrize("block_rows", [37, 128, 1000])
def test_every_labeling_matches_sklearn_whatever_the_block_size(gaussian, block_rows):
    X = gaussian(301, 5, seed=8)
    labels = labelings(X)
    ours = silhouette_scores(X, labels, block_rows=block_rows)
    for j in range(labels.shape[1]):
        reference = silhouette_score(X.numpy(), labels[:, j].numpy())
        assert float(ours[j]) == pytest.approx(reference, abs=1e-12)


def test_every_labeling_matches_sklearn_from_the_distance_matrix(gaussian):
    X = gaussian(301, 5, seed=8)
    labels = labelings(X)
    ours = silhouette_scores(X, labels, distances=pairwise_distances_(gram_matrix(X)))
    for j in range(labels.shape[1]):
        reference = silhouette_score(X.numpy(), labels[:, j].numpy())
        assert float(ours[j]) == pytest.approx(reference, abs=1e-12)


def test_one_nonempty_cluster_scores_zero(gaussian):
    X = gaussian(20, 3)
    assert float(silhouette_scores(X, torch.zeros(20, 1, dtype=torch.long))[0]) == 0.0
