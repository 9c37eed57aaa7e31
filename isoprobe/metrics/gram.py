"""Gram matrices of token rows: X Xᵀ, which the k-means sweep shares and then turns into the
pairwise distances that the silhouettes need, and Xᵀ X, from which the spectral metrics start."""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

BLOCK_ROWS = 256


def _empty_square(n: int, like: Tensor) -> Tensor:
    """An uninitialised [n, n] tensor of ``like``'s dtype and device. On the CPU, in float64,
    its memory comes from numpy, which asks the kernel for transparent huge pages where it
    only grants them on request (``madvise``): at N = 8000 the 512 MB matrix then costs some
    800 page faults instead of 126,000 (a quarter of the Gram matrix's time)."""
    if like.device.type == "cpu" and like.dtype == torch.float64:
        return torch.from_numpy(np.empty((n, n)))
    return torch.empty(n, n, dtype=like.dtype, device=like.device)


def gram_matrix(X: Tensor, block_rows: int = BLOCK_ROWS) -> Tensor:
    """X Xᵀ, exactly symmetric: each panel of ``block_rows`` rows is multiplied with the rows
    from its own on; what lies below the diagonal is copied from above it."""
    n = X.shape[0]
    gram = _empty_square(n, X)
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


@numba.njit(cache=True, nogil=True)
def _distances_in_place(gram: np.ndarray, squares: np.ndarray) -> None:
    n = gram.shape[0]
    for i in range(n):
        for j in range(n):
            squared = (-2.0 * gram[i, j] + squares[i]) + squares[j]
            gram[i, j] = np.sqrt(squared) if squared > 0 else 0.0
        gram[i, i] = 0.0


def pairwise_distances_(
    gram: Tensor, block_rows: int = BLOCK_ROWS, compiled: bool = True
) -> Tensor:
    """Turn the Gram matrix X Xᵀ of float64 rows into their Euclidean distances, in place:
    D[i, j] = sqrt(max(||x_i||² + ||x_j||² - 2 <x_i, x_j>, 0)), zero on the diagonal, exactly
    symmetric if ``gram`` is. Returns ``gram``, which no longer holds the inner products.

    On the CPU one compiled pass over the matrix; elsewhere (or with ``compiled=False``) the
    same arithmetic, in the same order, panel by panel in PyTorch."""
    squares = gram.diagonal().clone()
    if compiled and gram.device.type == "cpu" and gram.is_contiguous():
        _distances_in_place(gram.numpy(), squares.numpy())
        return gram
    for i in range(0, gram.shape[0], block_rows):
        rows = slice(i, i + block_rows)
        panel = gram[rows]
        panel.mul_(-2).add_(squares[rows, None]).add_(squares[None, :]).clamp_min_(0).sqrt_()
    return gram.fill_diagonal_(0)
