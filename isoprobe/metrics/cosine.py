"""Inter-token cosine similarity (isotropy paper, eq. 1)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from isoprobe.metrics._tokens import as_token_matrix, centre


def mean_pairwise_cosine(X: Tensor) -> float:
    """Mean of cos(x_i, x_j) over ordered pairs i != j of float64 rows, in O(N·D).

    With u_i = x_i / ||x_i||, sum_{i != j} <u_i, u_j> = ||sum_i u_i||^2 - N. Rows of zero norm
    have no direction and are left out; with fewer than two left the mean is NaN.
    """
    norms = X.norm(dim=1)
    keep = norms > 0
    n = int(keep.sum())
    if n < 2:
        return math.nan
    u_sum = torch.where(keep, 1 / norms, 0.0) @ X  # sum of the unit rows, without a copy of X
    return float((u_sum.dot(u_sum) - n) / (n * (n - 1)))


def inter_token_cosine(X: Tensor, center: bool = False) -> float:
    """Average cosine similarity between distinct token representations (eq. 1).

    ``center=True`` subtracts the mean token first (Mu & Viswanath, 2018). Zero rows are left
    out; NaN if fewer than two rows remain.
    """
    X = as_token_matrix(X)
    return mean_pairwise_cosine(centre(X) if center else X)
