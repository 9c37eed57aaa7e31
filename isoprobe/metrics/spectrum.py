"""Spectral measures of anisotropy: effective dimension, participation ratio, IsoScore and the
partition-function ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from isoprobe.metrics._checks import as_token_matrix


@dataclass(frozen=True)
class PartitionRatio:
    """min_c Z(c) / max_c Z(c) (``ratio``) and its logarithm (``log_ratio`` <= 0)."""

    ratio: float
    log_ratio: float


def covariance_eigh(centred: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenvalues (descending, clipped at 0) and eigenvectors (columns) of the covariance of
    already-centred float64 rows."""
    values, vectors = torch.linalg.eigh(centred.T @ centred / (centred.shape[0] - 1))
    return values.flip(0).clamp_min(0), vectors.flip(1)


def covariance_eigenvalues(X: Tensor) -> Tensor:
    """Eigenvalues of the covariance of float64 rows X, descending, clipped at 0."""
    centred = X - X.mean(dim=0)
    cov = centred.T @ centred / (X.shape[0] - 1)
    return torch.linalg.eigvalsh(cov).flip(0).clamp_min(0)


def effective_dimension_from_eigenvalues(eigenvalues: Tensor, threshold: float) -> int:
    """Smallest d with sum_{i<d} lambda_i / sum lambda >= threshold; 0 for a zero spectrum."""
    total = eigenvalues.sum()
    if total <= 0:
        return 0
    explained = eigenvalues.cumsum(0) / total
    return int((explained < threshold).sum()) + 1


def participation_ratio_from_eigenvalues(eigenvalues: Tensor) -> float:
    """(sum lambda)^2 / sum lambda^2; 0 for a zero spectrum."""
    squares = eigenvalues.square().sum()
    return 0.0 if squares <= 0 else float(eigenvalues.sum() ** 2 / squares)


def isoscore_from_eigenvalues(eigenvalues: Tensor) -> float:
    """IsoScore (Rudman et al., 2022) from the variances along the principal axes.

    sigma_hat = sqrt(D) sigma / ||sigma||; defect delta = ||sigma_hat - 1|| / sqrt(2(D - sqrt D));
    score = ((D - delta^2 (D - sqrt D))^2 - D) / (D (D - 1)). 1 is isotropic, 0 one-dimensional.
    """
    dim = eigenvalues.numel()
    norm = eigenvalues.norm()
    if norm <= 0 or dim < 2:
        return 0.0
    root = math.sqrt(dim)
    normalised = root * eigenvalues / norm
    defect_sq = float((normalised - 1).square().sum()) / (2 * (dim - root))
    return ((dim - defect_sq * (dim - root)) ** 2 - dim) / (dim * (dim - 1))


def effective_dimension(X: Tensor, threshold: float = 0.8) -> int:
    """Principal components needed to explain ``threshold`` of the variance (isotropy paper
    §4.1, Table 1), over the full spectrum."""
    return effective_dimension_from_eigenvalues(covariance_eigenvalues(as_token_matrix(X)), threshold)


def participation_ratio(X: Tensor) -> float:
    """(sum lambda)^2 / sum lambda^2 of the covariance spectrum: a soft count of used axes."""
    return participation_ratio_from_eigenvalues(covariance_eigenvalues(as_token_matrix(X)))


def isoscore(X: Tensor) -> float:
    """IsoScore of the token cloud, in [0, 1]."""
    return isoscore_from_eigenvalues(covariance_eigenvalues(as_token_matrix(X)))


def partition_ratio(X: Tensor) -> PartitionRatio:
    """Stabilised partition-function ratio (isotropy paper eq. 5, after Mu & Viswanath 2018).

    Z(c) = sum_i exp(<c, x_i>) for unit c in {+v, -v : v eigenvector of X^T X} (uncentred).
    log Z is a logsumexp, so no exponential overflows; using both signs makes the result
    independent of the eigensolver's sign convention. 1 = isotropic.
    """
    X = as_token_matrix(X)
    _, vectors = torch.linalg.eigh(X.T @ X)
    projections = X @ vectors
    log_z = torch.cat([projections.logsumexp(dim=0), (-projections).logsumexp(dim=0)])
    log_ratio = float(log_z.min() - log_z.max())
    return PartitionRatio(ratio=math.exp(log_ratio), log_ratio=log_ratio)
