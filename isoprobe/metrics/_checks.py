"""Input validation shared by every metric: float64, 2-D, enough rows, all finite."""

from __future__ import annotations

import torch
from torch import Tensor


def as_token_matrix(X: Tensor, *, name: str = "X", min_rows: int = 2) -> Tensor:
    """``X`` as a float64 [N, D] tensor on its own device, or a ValueError naming the problem."""
    if not isinstance(X, Tensor):
        X = torch.as_tensor(X)
    if X.dim() != 2:
        raise ValueError(f"{name} must be a 2-D [N, D] matrix of token rows, got shape {tuple(X.shape)}")
    if X.shape[0] < min_rows:
        raise ValueError(
            f"{name} has {X.shape[0]} row(s); at least {min_rows} token rows are needed "
            "(probe more windows or tokens)"
        )
    X = X.to(torch.float64)
    bad = ~torch.isfinite(X).all(dim=1)
    if bad.any():
        raise ValueError(
            f"{name} has {int(bad.sum())} of {X.shape[0]} rows holding NaN/inf; drop or impute "
            "them before measuring (a diverged model or unmasked padding usually causes this)"
        )
    return X
