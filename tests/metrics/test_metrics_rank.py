"""singular_values and epsilon_rank on matrices built with chosen singular values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from isoprobe.metrics import epsilon_rank, singular_values
from isoprobe.metrics.rank import rank_metric, token_rank_epsilon


def with_singular_values(sigma: list[float], rows: int, seed: int = 0) -> torch.Tensor:
    """U diag(sigma) V^T with random orthogonal U [rows, r] and V [r, r]."""
    rng = np.random.default_rng(seed)
    r = len(sigma)
    U, _ = np.linalg.qr(rng.normal(size=(rows, r)))
    V, _ = np.linalg.qr(rng.normal(size=(r, r)))
    return torch.as_tensor(U * np.array(sigma) @ V.T)


def test_singular_values_are_the_chosen_ones_descending():
    sigma = [10, 5, 1, 0.5, 0.09, 0.011, 0.009, 0, 0, 0]
    M = with_singular_values(sigma, rows=30)
    reference = np.linalg.svd(M.numpy(), compute_uv=False)
    assert torch.allclose(singular_values(M), torch.tensor(sigma, dtype=torch.float64), atol=1e-12)
    assert np.allclose(singular_values(M).numpy(), reference, atol=1e-12)


def test_epsilon_rank_counts_relative_singular_values_at_least_eps():
    # every ratio sigma_i / sigma_1 sits at least 20% away from each eps, so rounding in the
    # SVD cannot move a value across a threshold (ties are tested on exact powers of two below)
    M = with_singular_values([10, 5, 1.3, 0.5, 0.08, 0.013, 0.008, 0, 0, 0], rows=30)
    assert epsilon_rank(M, 1e-1) == 3  # 10, 5, 1.3
    assert epsilon_rank(M, 1e-2) == 4  # + 0.5; not 0.08
    assert epsilon_rank(M, 1e-3) == 6  # + 0.08, 0.013; not 0.008
    assert epsilon_rank(M.T, 1e-3) == 6


def test_threshold_is_inclusive_and_the_zero_matrix_has_rank_zero():
    M = torch.diag(torch.tensor([4.0, 2.0, 1.0, 0.5]))  # exact powers of two
    assert epsilon_rank(M, 0.5) == 2
    assert epsilon_rank(M, 0.25) == 3
    assert epsilon_rank(M, 1.0) == 1
    assert epsilon_rank(torch.zeros(3, 5), 1e-3) == 0


def test_bad_eps_or_shape_is_refused():
    with pytest.raises(ValueError, match=r"eps must lie in \(0, 1\]"):
        epsilon_rank(torch.eye(3), 0.0)
    with pytest.raises(ValueError, match="2-D"):
        singular_values(torch.ones(2, 2, 2))


def test_a_token_rank_name_gives_back_its_epsilon_and_other_names_none():
    for eps in (0.1, 0.01, 1e-3, 1e-6):
        assert token_rank_epsilon(rank_metric(eps)) == pytest.approx(eps, rel=1e-12)
    for other in (
        rank_metric(0.01, "q"),
        "isoscore",
        "rank_uncentred_eps",
        "x_rank_uncentred_eps0.1",
    ):
        assert token_rank_epsilon(other) is None
