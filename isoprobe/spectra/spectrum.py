"""What figure 2 reads from an embedded-input matrix Ξ [n tokens, d]: its singular values
relative to the largest (panel a), its ε-ranks (eq. 1, :mod:`isoprobe.metrics.rank`) and its rows
projected on its two leading right singular vectors (panels b, c). Ξ is not centred, as in the
paper's ε-rank of embedded inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from isoprobe.metrics.rank import rank_from_singular_values, singular_values


@dataclass(frozen=True)
class EmbeddingSpectrum:
    """One model's embedded inputs: σᵢ/σ₁ (descending, float64), the matrix's shape, and the
    coordinates of its rows on the two leading right singular vectors [n, 2]."""

    relative: Tensor
    shape: tuple[int, int]
    projection: Tensor

    def epsilon_rank(self, eps: float) -> int:
        return rank_from_singular_values(self.relative, eps)


def embedding_spectrum(embedded: Tensor) -> EmbeddingSpectrum:
    """σᵢ/σ₁ of ``embedded`` [n, d] and its rows' coordinates on the two leading right singular
    vectors (signs fixed so each vector's largest-magnitude entry is positive)."""
    if embedded.dim() != 2 or min(embedded.shape) < 2:
        raise ValueError(f"expected an [n, d] matrix with n, d >= 2, got {tuple(embedded.shape)}")
    matrix = embedded.detach().to(torch.float64)
    sigma = singular_values(matrix)
    if float(sigma[0]) <= 0:
        raise ValueError("the embedded inputs are all zero: they have no spectrum")
    _, _, vh = torch.linalg.svd(matrix, full_matrices=False)
    leading = vh[:2]
    signs = torch.sign(leading.gather(1, leading.abs().argmax(dim=1, keepdim=True)))
    projection = matrix @ (leading * signs).T
    return EmbeddingSpectrum(sigma / sigma[0], tuple(matrix.shape), projection)
