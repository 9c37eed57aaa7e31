"""Eigenvalues of a diagonal matrix minus a rank-one term, from the secular equation.

For diag(λ) - z zᵀ (λ ascending), the eigenvalues t are the roots of

    f(t) = 1 - Σ_j z_j² / (λ_j - t),

one in each interval (λ_{i-1}, λ_i) and the smallest in [λ_0 - ||z||², λ_0] (Golub 1973).
f decreases from +∞ to -∞ across each interval, so a bracket always holds the root. Where
z_i = 0 or λ_{i-1} = λ_i the interval's root sits on its end, which bisection reaches
as well: no separate deflation is needed.

The probe uses it to take the centred covariance spectrum from the eigendecomposition of
Xᵀ X = V diag(λ) Vᵀ that the partition ratio needs anyway: Cᵀ C = Xᵀ X - N μ μᵀ, so in the
basis V it is diag(λ) - z zᵀ with z = √N Vᵀ μ. That replaces a second dense
eigendecomposition with O(D²) work per iteration.
"""

from __future__ import annotations

import numba
import numpy as np

MAX_ITERATIONS = 200


@numba.njit(cache=True, nogil=True, fastmath=True)
def _secular(t: float, diagonal: np.ndarray, squares: np.ndarray) -> tuple[float, float]:
    """f(t) and f'(t); t lies strictly inside a bracket, so no λ_j - t is zero."""
    total = 0.0
    slope = 0.0
    for j in range(diagonal.shape[0]):
        inverse = 1.0 / (diagonal[j] - t)
        term = squares[j] * inverse
        total += term
        slope += term * inverse
    return 1.0 - total, -slope


@numba.njit(cache=True, nogil=True)
def rank_one_downdate_eigenvalues(diagonal: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Eigenvalues of diag(``diagonal``) - z zᵀ, ascending; ``diagonal`` must be ascending.

    Each root is bracketed and found by Newton's method, with a bisection step whenever
    Newton would leave the bracket or not move, until the bracket is narrower than a few
    units of rounding at the scale max(|λ|, ||z||²): the accuracy of the eigendecomposition
    that produced λ."""
    n = diagonal.shape[0]
    squares = z * z
    norm_sq = squares.sum()
    scale = max(np.abs(diagonal).max(), norm_sq)
    tolerance = 4.0 * np.finfo(np.float64).eps * scale
    roots = np.empty(n)
    for i in range(n):
        lo = diagonal[0] - norm_sq if i == 0 else diagonal[i - 1]
        hi = diagonal[i]
        t = 0.5 * (lo + hi)
        for _ in range(MAX_ITERATIONS):
            if hi - lo <= tolerance or not lo < t < hi:
                break
            value, slope = _secular(t, diagonal, squares)
            if value == 0.0:
                lo = hi = t
                break
            if value > 0.0:
                lo = t
            else:
                hi = t
            # bisect where Newton would leave the bracket or stall on t, or where f is flat
            # (every z_j zero: the root is the bracket's end)
            step = t - value / slope if slope != 0.0 else hi
            t = step if lo < step < hi and step != t else 0.5 * (lo + hi)
        roots[i] = 0.5 * (lo + hi)
    return roots
