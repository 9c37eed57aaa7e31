"""The Chebyshev fixed input embedding of rank k (the rank-structure paper, appendix I).

A real value x in [-x_max, x_max] is embedded as ``Φ_k(x) = Σ_{j=1..k} T_j(x / x_max) u_j``:
T_j the degree-j Chebyshev polynomial (orthogonal on [-1, 1], so the basis is well conditioned,
unlike monomials) and u_1..u_k seeded random orthonormal vectors of the model width. The image of
the real line lies in a k-dimensional subspace, so the embedded inputs have rank at most k (k for
k or more distinct values): the knob of the paper's figure 4 experiment (raise the embedding's
rank, watch the pretrained model's numerical ranks).
"""

from __future__ import annotations

import torch
from torch import Tensor


def chebyshev_features(x: Tensor, rank: int) -> Tensor:
    """[..., rank]: T_1(x), ..., T_rank(x), by the recurrence T_{j+1} = 2x T_j - T_{j-1}."""
    if rank < 1:
        raise ValueError(f"the Chebyshev embedding's rank must be >= 1, got {rank}")
    previous, current = torch.ones_like(x), x
    features = [current]
    for _ in range(rank - 1):
        previous, current = current, 2 * x * current - previous
        features.append(current)
    return torch.stack(features, dim=-1)


def chebyshev_embedding(
    values: Tensor, rank: int, width: int, x_max: float, seed: int, extra_rows: int = 0
) -> Tensor:
    """The embedding matrix [extra_rows + len(values), width] (float32): ``extra_rows`` special
    tokens first, each on its own seeded random direction orthogonal to u_1..u_k (so they stay
    apart from every value), then ``Φ_k(value)`` of every value (clamped to [-x_max, x_max])."""
    if rank + extra_rows > width:
        raise ValueError(
            f"a rank-{rank} Chebyshev embedding with {extra_rows} special tokens needs a model "
            f"width of at least {rank + extra_rows}, got {width}"
        )
    generator = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(
        torch.randn(width, rank + extra_rows, generator=generator, dtype=torch.float64)
    )
    x = (values.double() / x_max).clamp(-1.0, 1.0)
    embedded = chebyshev_features(x, rank) @ basis[:, :rank].T
    special = basis[:, rank:].T
    return torch.cat([special, embedded]).float()
