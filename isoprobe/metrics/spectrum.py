"""Spectral measures of anisotropy: effective dimension, participation ratio, IsoScore and the
partition-function ratio."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from isoprobe.metrics._tokens import as_token_matrix, centre
from isoprobe.metrics.gram import feature_gram
from isoprobe.metrics.secular import rank_one_downdate_eigenvalues


@dataclass(frozen=True)
class PartitionRatio:
    """min_c Z(c) / max_c Z(c) (``ratio``) and its logarithm (``log_ratio`` <= 0)."""

    ratio: float
    log_ratio: float


#: The downdate of :func:`covariance_eigenvalues_from_uncentred` is trusted while the largest
#: eigenvalue of Xᵀ X is at most this many times the largest of Cᵀ C: its rounding, a few
#: units at the scale of Xᵀ X, then stays below 1e-11 of the covariance spectrum.
MAX_OFFSET_RATIO = 1e4


def covariance_eigenvalues(centred_gram: Tensor, n_rows: int) -> Tensor:
    """Eigenvalues of the covariance C^T C / (N - 1), from C^T C of centred rows C:
    descending, clipped at 0."""
    return torch.linalg.eigvalsh(centred_gram / (n_rows - 1)).flip(0).clamp_min(0)


def covariance_eigenvalues_from_uncentred(
    values: Tensor, vectors: Tensor, mean: Tensor, n_rows: int
) -> Tensor | None:
    """The eigenvalues of :func:`covariance_eigenvalues`, from the eigendecomposition
    (``values`` ascending, ``vectors``) of Xᵀ X = Cᵀ C + N μ μᵀ: Cᵀ C is diag(values) - z zᵀ in
    the basis of ``vectors``, z = √N Vᵀ μ, whose eigenvalues the secular equation gives
    (:mod:`isoprobe.metrics.secular`). None when the rows' common offset dwarfs their spread
    (see :data:`MAX_OFFSET_RATIO`), where subtracting it would leave mostly rounding."""
    z = math.sqrt(n_rows) * (vectors.T @ mean)
    roots = rank_one_downdate_eigenvalues(values.cpu().numpy(), z.cpu().numpy())
    if roots.max() * MAX_OFFSET_RATIO < float(values.max()):
        return None
    roots = torch.from_numpy(roots).to(values.device)
    return (roots / (n_rows - 1)).flip(0).clamp_min(0)


def effective_dimension_from_eigenvalues(eigenvalues: Tensor, threshold: float) -> int:
    """Smallest d with sum_{i<d} lambda_i / sum lambda >= threshold (descending lambda), up to
    a relative 1e-12 so that rounding noise in the zero eigenvalues of a rank-deficient cloud
    does not count at ``threshold = 1``; 0 for a zero spectrum."""
    if not 0 < threshold <= 1:
        raise ValueError(f"the effective-dimension threshold must lie in (0, 1], got {threshold}")
    total = eigenvalues.sum()
    if total <= 0:
        return 0
    explained = eigenvalues.cumsum(0) / total
    return min(int((explained < threshold * (1 - 1e-12)).sum()) + 1, eigenvalues.numel())


def participation_ratio_from_eigenvalues(eigenvalues: Tensor) -> float:
    """(sum lambda)^2 / sum lambda^2; 0 for a zero spectrum."""
    squares = eigenvalues.square().sum()
    return 0.0 if squares <= 0 else float(eigenvalues.sum() ** 2 / squares)


def isoscore_from_eigenvalues(eigenvalues: Tensor) -> float:
    """IsoScore (Rudman et al. 2022, Algorithm 1) from the variances along the principal axes.

    sigma_hat = sqrt(D) sigma / ||sigma||; isotropy defect delta = ||sigma_hat - 1|| /
    sqrt(2 (D - sqrt D)); score = ((D - delta^2 (D - sqrt D))^2 - D) / (D (D - 1)), clipped to
    [0, 1] against rounding. 1 is isotropic, 0 one-dimensional or a zero spectrum; NaN for
    D = 1, where it is undefined.
    """
    dim = eigenvalues.numel()
    if dim < 2:
        return math.nan
    norm = eigenvalues.norm()
    if norm <= 0:
        return 0.0
    root = math.sqrt(dim)
    normalised = root * eigenvalues / norm
    defect_sq = float((normalised - 1).square().sum()) / (2 * (dim - root))
    score = ((dim - defect_sq * (dim - root)) ** 2 - dim) / (dim * (dim - 1))
    return min(max(score, 0.0), 1.0)


def partition_ratio_from_eigenvectors(X: Tensor, vectors: Tensor) -> PartitionRatio:
    """:func:`partition_ratio` of float64 rows X given the eigenvectors of X^T X (columns).

    With p_i = <v, x_i> (a contiguous row of V^T X^T), hi = max p_i and lo = min p_i:
    log Z(v) = hi + log sum_i exp(p_i - hi) and log Z(-v) = -lo + log sum_i exp(lo - p_i)."""
    projections = vectors.T @ X.T  # [D, N]: row j holds <v_j, x_i> for every i
    top = projections.amax(dim=1, keepdim=True)
    bottom = projections.amin(dim=1, keepdim=True)
    log_z_plus = (projections - top).exp_().sum(dim=1).log_() + top[:, 0]
    log_z_minus = (bottom - projections).exp_().sum(dim=1).log_() - bottom[:, 0]
    log_z = torch.cat([log_z_plus, log_z_minus])
    log_ratio = float(log_z.min() - log_z.max())
    return PartitionRatio(ratio=math.exp(log_ratio), log_ratio=log_ratio)


def _eigenvalues(X: Tensor) -> Tensor:
    centred = centre(as_token_matrix(X))
    return covariance_eigenvalues(feature_gram(centred), centred.shape[0])


def effective_dimension(X: Tensor, threshold: float = 0.8) -> int:
    """Principal components needed to explain ``threshold`` of the variance (isotropy paper
    §4.1, Table 1), over the full covariance spectrum; 0 if all rows are identical."""
    return effective_dimension_from_eigenvalues(_eigenvalues(X), threshold)


def participation_ratio(X: Tensor) -> float:
    """(sum lambda)^2 / sum lambda^2 of the covariance spectrum: a soft count of the axes used;
    0 if all rows are identical."""
    return participation_ratio_from_eigenvalues(_eigenvalues(X))


def isoscore(X: Tensor) -> float:
    """IsoScore of the token cloud, in [0, 1] (see :func:`isoscore_from_eigenvalues`)."""
    return isoscore_from_eigenvalues(_eigenvalues(X))


def partition_ratio(X: Tensor) -> PartitionRatio:
    """Partition-function ratio (isotropy paper eq. 5, after Mu & Viswanath 2018).

    Z(c) = sum_i exp(<c, x_i>) for unit c in {+v, -v : v eigenvector of X^T X} (uncentred X);
    ``log_ratio`` = min log Z - max log Z. Each log Z is a logsumexp, so nothing overflows
    however large the norms; taking both signs makes the result independent of the
    eigensolver's sign convention. 1 = isotropic.
    """
    X = as_token_matrix(X)
    return partition_ratio_from_eigenvectors(X, torch.linalg.eigh(feature_gram(X)).eigenvectors)
