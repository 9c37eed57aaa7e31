"""Token matrices: validation (float64, 2-D, enough rows, all finite) and exact centring."""

from __future__ import annotations

import torch
from torch import Tensor


def as_token_matrix(X: Tensor, *, name: str = "X", min_rows: int = 2) -> Tensor:
    """``X`` as a float64 [N, D] tensor on its own device, detached from any autograd graph
    (the metrics are measurements, not losses), or a ValueError naming the problem."""
    if not isinstance(X, Tensor):
        X = torch.as_tensor(X)
    if X.dim() != 2:
        raise ValueError(
            f"{name} must be a 2-D [N, D] matrix of token rows, got shape {tuple(X.shape)}"
        )
    if X.shape[0] < min_rows:
        raise ValueError(
            f"{name} has {X.shape[0]} row(s); at least {min_rows} token rows are needed "
            "(probe more windows or tokens)"
        )
    X = X.detach().to(torch.float64)
    if bool(torch.isfinite(X.sum(dim=1)).all()):  # one pass; a NaN or inf spoils its row's sum
        return X
    bad = ~torch.isfinite(X).all(dim=1)
    if bad.any():
        raise ValueError(
            f"{name} has {int(bad.sum())} of {X.shape[0]} rows holding NaN/inf; drop or impute "
            "them before measuring (a diverged model or unmasked padding usually causes this)"
        )
    return X


def centre(X: Tensor) -> Tensor:
    """X minus its mean row, computed as (X - x_0) - mean(X - x_0).

    Shifting by a row first keeps the common offset (large in transformer layers) out of the
    rounding of the mean, and makes identical rows centre to exact zeros.
    """
    shifted = X - X[:1]
    return shifted - shifted.mean(dim=0)
