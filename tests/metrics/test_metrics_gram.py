"""Gram matrices and the pairwise distances made from them in place, against scipy."""

from __future__ import annotations

import pytest
import torch
from scipy.spatial.distance import cdist

from isoprobe.metrics.gram import feature_gram, gram_matrix, pairwise_distances_


@pytest.mark.parametrize("compiled", [True, False])
def test_distances_from_the_gram_matrix_match_scipy(separated_clusters, compiled):
    X, _ = separated_clusters(sizes=(70, 50, 30), d=12, seed=4)
    distances = pairwise_distances_(gram_matrix(X), block_rows=37, compiled=compiled)
    reference = torch.as_tensor(cdist(X.numpy(), X.numpy()))
    assert torch.allclose(distances, reference, rtol=1e-9, atol=1e-9 * float(reference.max()))
    assert torch.equal(distances, distances.T)
    assert bool((distances.diagonal() == 0).all())


def test_compiled_and_pytorch_distances_agree_to_the_last_bit(gaussian):
    """Same arithmetic in the same order; only PyTorch's vectorised square root may round one
    unit in the last place differently from the correctly rounded one."""
    X = gaussian(203, 9, seed=2) * 1e3 + 5.0
    X[10] = X[3]  # a duplicate row: its distance must be exactly 0, not rounding noise
    gram = gram_matrix(X)
    compiled = pairwise_distances_(gram.clone())
    eager = pairwise_distances_(gram.clone(), block_rows=50, compiled=False)
    assert torch.allclose(compiled, eager, rtol=2.3e-16, atol=0)
    assert float(compiled[3, 10]) == 0.0


def test_the_gram_matrix_becomes_the_distances(gaussian):
    gram = gram_matrix(gaussian(40, 3))
    assert pairwise_distances_(gram) is gram


def test_feature_gram_is_the_exactly_symmetric_covariance_product(gaussian):
    X = gaussian(300, 140, seed=5)
    product = feature_gram(X)
    assert torch.equal(product, product.T)
    assert torch.allclose(product, X.T @ X, rtol=1e-12, atol=1e-9)
