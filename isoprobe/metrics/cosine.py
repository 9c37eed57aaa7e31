"""Inter-token cosine similarity (isotropy paper, eq. 1)."""

from __future__ import annotations

import math

from torch import Tensor

from isoprobe.metrics._checks import as_token_matrix


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
    u_sum = (X[keep] / norms[keep, None]).sum(dim=0)
    return float((u_sum.dot(u_sum) - n) / (n * (n - 1)))


def inter_token_cosine(X: Tensor, center: bool = False) -> float:
    """Average cosine similarity between distinct token representations (eq. 1).

    ``center=True`` subtracts the mean token first (Mu & Viswanath, 2018).
    """
    X = as_token_matrix(X)
    if center:
        X = X - X.mean(dim=0)
    return mean_pairwise_cosine(X)
