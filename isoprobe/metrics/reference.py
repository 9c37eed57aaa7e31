"""Every probe metric in its plainest form: numpy and scikit-learn, one short function each, the
paper's equation in the docstring. This is the definition to read; the functions of
:mod:`isoprobe.metrics` are the fast paths, and the tests and ``bench/`` check them against it.

X is a float array [N, D] of N token representations; "the isotropy paper" is *When can
isotropy help adapt LLMs' next word prediction to numerical domains?*, "the rank paper" the
rank-structure paper on time-series foundation models.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp
from sklearn.cluster import KMeans
from sklearn.metrics import silhouette_score


def inter_token_cosine(X: np.ndarray) -> float:
    """Isotropy paper eq. 1: the mean of cos(x_i, x_j) over all ordered pairs i != j, from the
    full N x N matrix of cosines (rows of zero norm left out)."""
    X = X[np.linalg.norm(X, axis=1) > 0]
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    cosines = U @ U.T
    n = len(U)
    return float((cosines.sum() - np.trace(cosines)) / (n * (n - 1)))


def cluster_adjusted_cosine(
    X: np.ndarray, k_min: int = 2, k_max: int = 16, min_silhouette: float = 0.1, seed: int = 0
) -> tuple[float, int, float]:
    """Isotropy paper eq. 6 and appendix D, as the authors compute it: centre X; k-means for
    every k in [k_min, k_max] (scikit-learn, k-means++); keep the k of the largest mean
    silhouette, or one cluster if that silhouette is below ``min_silhouette``; inside each
    cluster subtract its centroid and take eq. 1; average over clusters of two or more rows.
    Returns (value, k, best silhouette)."""
    centred = X - X.mean(axis=0)
    best_k, best_score, best_labels = 1, -np.inf, np.zeros(len(X), dtype=int)
    for k in range(k_min, min(k_max, len(X) - 1) + 1):
        labels = KMeans(n_clusters=k, random_state=seed, n_init=1).fit_predict(centred)
        score = silhouette_score(centred, labels)
        if score > best_score:
            best_k, best_score, best_labels = k, score, labels
    if best_score < min_silhouette:
        best_k, best_labels = 1, np.zeros(len(X), dtype=int)
    values = [
        inter_token_cosine(members - members.mean(axis=0))
        for members in (centred[best_labels == c] for c in range(best_k))
        if len(members) >= 2
    ]
    return float(np.mean(values)), best_k, float(best_score)


def covariance_spectrum(X: np.ndarray) -> np.ndarray:
    """Eigenvalues of the covariance of X (rows centred), descending."""
    return np.sort(np.linalg.eigvalsh(np.cov(X, rowvar=False, bias=True)))[::-1]


def effective_dimension(X: np.ndarray, threshold: float = 0.8) -> int:
    """Isotropy paper §4.1 and table 1: the fewest principal directions whose eigenvalues hold
    ``threshold`` of the total variance, over the full spectrum."""
    lam = covariance_spectrum(X)
    if lam.sum() <= 0:
        return 0
    return int(np.searchsorted(np.cumsum(lam) / lam.sum(), threshold) + 1)


def participation_ratio(X: np.ndarray) -> float:
    """(sum of eigenvalues)^2 / sum of squared eigenvalues of the covariance."""
    lam = covariance_spectrum(X)
    return float(lam.sum() ** 2 / (lam**2).sum()) if lam.sum() > 0 else 0.0


def partition_ratio(X: np.ndarray) -> float:
    """Isotropy paper eq. 5 (after Mu & Viswanath, 2018): Z(c) = sum_i exp(<c, x_i>) over unit
    directions c = +-v for every eigenvector v of X^T X (X not centred); the ratio
    min Z / max Z, computed in log space. 1 is isotropic."""
    _, vectors = np.linalg.eigh(X.T @ X)
    directions = np.hstack([vectors, -vectors])
    log_z = logsumexp(X @ directions, axis=0)
    return float(np.exp(log_z.min() - log_z.max()))


def isoscore(X: np.ndarray) -> float:
    """IsoScore (Rudman et al., 2022): the variances along the principal axes, scaled to norm
    sqrt(D); the isotropy defect delta = ||sigma - 1|| / sqrt(2 (D - sqrt D)); the score
    ((D - delta^2 (D - sqrt D))^2 - D) / (D (D - 1)). 1 is isotropic."""
    d = X.shape[1]
    variances = covariance_spectrum(X)
    if variances.sum() <= 0:
        return 0.0
    sigma = np.sqrt(d) * variances / np.linalg.norm(variances)
    defect = np.linalg.norm(sigma - 1) / np.sqrt(2 * (d - np.sqrt(d)))
    return float(((d - defect**2 * (d - np.sqrt(d))) ** 2 - d) / (d * (d - 1)))


def epsilon_rank(M: np.ndarray, eps: float) -> int:
    """Rank paper eq. 1, as its authors compute it: the number of singular values sigma_i of M
    with sigma_i / sigma_1 >= eps."""
    sigma = np.linalg.svd(M, compute_uv=False)
    return int((sigma / sigma[0] >= eps).sum()) if len(sigma) and sigma[0] > 0 else 0


def hsic(K: np.ndarray, L: np.ndarray, debiased: bool = False) -> float:
    """The Hilbert-Schmidt independence criterion of two N x N Gram matrices. Biased (Gretton
    et al., 2005): tr(K H L H) / (N - 1)^2 with H = I - 11^T / N. Debiased: the unbiased
    estimator of Song et al. (2012, eq. 5), with K~, L~ the Gram matrices with zero diagonal,
    [tr(K~ L~) + 1^T K~ 1 1^T L~ 1 / ((N - 1)(N - 2)) - 2 1^T K~ L~ 1 / (N - 2)] / (N (N - 3))."""
    n = len(K)
    if not debiased:
        H = np.eye(n) - np.ones((n, n)) / n
        return float(np.trace(K @ H @ L @ H) / (n - 1) ** 2)
    K, L = K - np.diag(np.diag(K)), L - np.diag(np.diag(L))
    ones = np.ones(n)
    value = (
        np.trace(K @ L)
        + (ones @ K @ ones) * (ones @ L @ ones) / ((n - 1) * (n - 2))
        - 2 * (ones @ K @ L @ ones) / (n - 2)
    )
    return float(value / (n * (n - 3)))


def linear_cka(X: np.ndarray, Y: np.ndarray, debiased: bool = False) -> float:
    """Linear centred kernel alignment (Kornblith et al., 2019, eq. 3) of two representations
    X [N, D1] and Y [N, D2] of the same N inputs (row i of X and row i of Y the same token):
    HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) with the linear kernels K = X X^T and L = Y Y^T.
    ``debiased`` takes Song et al.'s unbiased HSIC, as Nguyen et al. (2021) do for small N (a
    debiased CKA can fall below 0). 1 when Y is X up to an orthogonal map and an isotropic
    scale."""
    K, L = X @ X.T, Y @ Y.T
    return hsic(K, L, debiased) / np.sqrt(hsic(K, K, debiased) * hsic(L, L, debiased))
