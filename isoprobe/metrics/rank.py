"""Singular values and numerical rank (rank-structure paper, eq. 1)."""

from __future__ import annotations

import torch
from torch import Tensor


def singular_values(M: Tensor) -> Tensor:
    """Singular values of the matrix ``M`` in float64, descending."""
    if not isinstance(M, Tensor):
        M = torch.as_tensor(M)
    if M.dim() != 2:
        raise ValueError(f"expected a 2-D matrix, got shape {tuple(M.shape)}")
    return torch.linalg.svdvals(M.to(torch.float64))


def rank_from_singular_values(sigma: Tensor, eps: float) -> int:
    """Count of sigma_i / sigma_1 >= eps for descending ``sigma``; 0 for the zero matrix."""
    if not 0 < eps <= 1:
        raise ValueError(f"eps must lie in (0, 1], got {eps}")
    if sigma.numel() == 0 or float(sigma[0]) <= 0:
        return 0
    return int((sigma / sigma[0] >= eps).sum())


def epsilon_rank(M: Tensor, eps: float) -> int:
    """epsilon-rank (rank-structure paper eq. 1, as its authors' code): the number of singular
    values of ``M`` at least ``eps`` times the largest."""
    return rank_from_singular_values(singular_values(M), eps)
