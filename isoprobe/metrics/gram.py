"""Gram matrices of token rows: X Xᵀ, which the k-means sweep and the silhouettes share, and
Xᵀ X, from which the spectral metrics start."""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK_ROWS = 256


def gram_matrix(X: Tensor, block_rows: int = BLOCK_ROWS) -> Tensor:
    """X Xᵀ, exactly symmetric: each panel of ``block_rows`` rows is multiplied with the rows
    from its own on; what lies below the diagonal is copied from above it."""
    n = X.shape[0]
    gram = torch.empty(n, n, dtype=X.dtype, device=X.device)
    for i in range(0, n, block_rows):
        rows = slice(i, i + block_rows)
        torch.mm(X[rows], X[i:].T, out=gram[rows, i:])
        diagonal = gram[rows, rows]
        diagonal.copy_(diagonal.triu() + diagonal.triu(1).T)
        gram[i + block_rows :, rows] = gram[rows, i + block_rows :].T
    return gram


def feature_gram(X: Tensor) -> Tensor:
    """Xᵀ X, exactly symmetric, from half the products (:func:`gram_matrix` of Xᵀ; narrow
    panels suit its few rows, one per feature)."""
    return gram_matrix(X.T.contiguous(), block_rows=128)
