"""kmeans_sweep: recovers separated clusters, ends at a Lloyd fixed point, handles ties."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from isoprobe.metrics import kmeans_sweep


def test_true_k_recovers_the_clusters_as_sklearn_does(separated_clusters):
    X, truth = separated_clusters()
    ks = list(range(2, 9))
    labels = kmeans_sweep(X, ks, seed=0)
    assert labels.shape == (X.shape[0], len(ks))
    for j, k in enumerate(ks):
        assert int(labels[:, j].min()) >= 0 and int(labels[:, j].max()) < k
    ours = labels[:, ks.index(4)].numpy()
    reference = KMeans(n_clusters=4, random_state=42).fit_predict(X.numpy())
    assert adjusted_rand_score(ours, truth) == 1.0
    assert adjusted_rand_score(ours, reference) == 1.0


@pytest.mark.parametrize(("search_dtype", "slack"), [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_without_tolerance_every_k_ends_at_a_lloyd_fixed_point(gaussian, search_dtype, slack):
    # No cluster structure, so Lloyd needs many iterations: each row must end nearest to the
    # mean of its own cluster, for every k of the sweep (up to float32 rounding when the
    # nearest centre is searched in float32).
    X = gaussian(400, 8, seed=7)
    ks = [2, 3, 5, 8, 13]
    labels = kmeans_sweep(X, ks, seed=3, tol=0.0, search_dtype=search_dtype).numpy()
    points = X.numpy()
    for j, k in enumerate(ks):
        centres = np.stack([points[labels[:, j] == c].mean(0) for c in range(k)])
        dist = ((points[:, None, :] - centres[None]) ** 2).sum(-1)
        own = dist[np.arange(len(points)), labels[:, j]]
        assert np.all(own <= dist.min(1) * (1 + slack))


def test_seed_fixes_the_result_and_duplicate_rows_share_a_label():
    base = torch.tensor([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]], dtype=torch.float64)
    X = base.repeat_interleave(4, dim=0)  # 12 rows, 3 distinct points, k up to 6
    labels = kmeans_sweep(X, [2, 3, 6], seed=11)
    assert torch.equal(labels, kmeans_sweep(X, [2, 3, 6], seed=11))
    for j in range(3):
        column = labels[:, j].view(3, 4)
        assert torch.all(column == column[:, :1])
    assert len(set(labels[:, 1].tolist())) == 3


def test_impossible_k_is_refused(gaussian):
    with pytest.raises(ValueError, match="k must lie in"):
        kmeans_sweep(gaussian(5, 2), [2, 6])
    with pytest.raises(ValueError, match="k must lie in"):
        kmeans_sweep(gaussian(5, 2), [1, 2])
