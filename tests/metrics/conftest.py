"""Point clouds whose geometry is known, and the reference definitions, for the metrics tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from isoprobe.metrics import reference


def _gaussian(n: int, d: int, seed: int = 0, scales: torch.Tensor | None = None) -> torch.Tensor:
    """n standard normal rows of width d (columns multiplied by ``scales`` if given)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    return X if scales is None else X * scales


def _separated_clusters(
    sizes: tuple[int, ...] = (200, 150, 120, 80), d: int = 24, seed: int = 0
) -> tuple[torch.Tensor, np.ndarray]:
    """Anisotropic Gaussian clusters of the given sizes, different scales and random rotations,
    centres far apart, plus a common offset; rows shuffled. Returns (X, true labels)."""
    rng = np.random.default_rng(seed)
    offset = rng.normal(size=d) * 10
    parts, truth = [], []
    for c, size in enumerate(sizes):
        rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
        stds = (0.5 + c * 0.4) * np.linspace(1.0, 0.2, d)
        centre = rng.normal(size=d) * 12
        parts.append(centre + (rng.normal(size=(size, d)) * stds) @ rotation.T)
        truth.append(np.full(size, c))
    order = rng.permutation(sum(sizes))
    X = np.concatenate(parts)[order] + offset
    return torch.as_tensor(X), np.concatenate(truth)[order]


@pytest.fixture
def gaussian():
    return _gaussian


@pytest.fixture
def separated_clusters():
    return _separated_clusters


@pytest.fixture
def brute_force_cosine():
    """Eq. 1 from the full N x N matrix of cosines (isoprobe.metrics.reference)."""
    return reference.inter_token_cosine
