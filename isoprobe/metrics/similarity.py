"""Linear CKA of two token matrices of the same tokens, in feature space (the plain definition,
through N x N Gram matrices, is :func:`isoprobe.metrics.reference.linear_cka`).

With C_X, C_Y the centred rows, the biased HSIC is ||C_Y^T C_X||_F^2 / (N - 1)^2 (Kornblith et
al., 2019, eq. 2), an O(N D1 D2) product instead of the N x N Gram matrices. Song et al.'s
unbiased HSIC is written in the same terms: for centred rows the Gram matrix K = C C^T has
K 1 = 0, so with s_i = ||c_i||^2 (its diagonal), 1^T K~ 1 = -sum s, K~ 1 = -s and
tr(K~ L~) = ||C_Y^T C_X||_F^2 - sum s^X_i s^Y_i. The unbiased estimator does not change when
the rows are shifted, so centring first gives the same value and keeps the common offset of a
transformer layer out of the rounding.

Where the rows are fewer than both widths (a few dozen probe windows against layers hundreds
wide, as ``task=analyze`` compares models), the same ||C_Y^T C_X||_F^2 is taken as the sum of
the elementwise product of the two N x N Gram matrices C C^T, an O(N^2 (D1 + D2)) product.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from torch import Tensor

from isoprobe.metrics._tokens import as_token_matrix, centre
from isoprobe.metrics.registry import DRIFT, PREVIOUS, MetricInfo, register_measure

#: 1 - CKA of a layer against itself at step 0 (isoprobe/probing/similarity.py)
CKA_DRIFT = "cka_drift"
#: CKA of a layer with the layer probed before it
CKA_PREV = "cka_prev"


@dataclass(frozen=True)
class CkaSide:
    """One token matrix prepared for CKA: its centred rows, their squared norms and its
    self-HSIC terms, computed once however many matrices it is compared with."""

    centred: Tensor  # [N, D] float64

    @classmethod
    def of(cls, X: Tensor, name: str = "X") -> CkaSide:
        return cls(centre(as_token_matrix(X, name=name, min_rows=4)))

    @property
    def n(self) -> int:
        return self.centred.shape[0]

    @cached_property
    def squared_norms(self) -> Tensor:
        return (self.centred * self.centred).sum(dim=1)

    @property
    def width(self) -> int:
        return self.centred.shape[1]

    @cached_property
    def row_gram(self) -> Tensor:
        """C C^T [N, N], for sides with fewer rows than columns (:func:`_cross_sq`)."""
        return self.centred @ self.centred.T

    @cached_property
    def gram_sq(self) -> float:
        """||C^T C||_F^2, by the very product the cross term of two sides takes, so that a
        matrix against an identical one has CKA exactly 1 (drift exactly 0)."""
        return _cross_sq(self, self)

    def self_hsic(self, debiased: bool) -> float:
        return _hsic(self.gram_sq, self, self, debiased)


def _cross_sq(x: CkaSide, y: CkaSide) -> float:
    """||C_Y^T C_X||_F^2 = sum((C_X C_X^T) * (C_Y C_Y^T)): through the N x N Gram matrices
    when the rows are fewer than both widths, else through the D_Y x D_X product."""
    if x.n < min(x.width, y.width):
        return float((x.row_gram * y.row_gram).sum())
    cross = y.centred.T @ x.centred
    return float((cross * cross).sum())


def _hsic(cross_sq: float, x: CkaSide, y: CkaSide, debiased: bool) -> float:
    """HSIC of two centred sides from ||C_Y^T C_X||_F^2 (``cross_sq``), up to a factor that
    CKA's ratio cancels (1 / (N - 1)^2 biased, 1 / (N (N - 3)) debiased)."""
    if not debiased:
        return cross_sq
    n = x.n
    sx, sy = x.squared_norms, y.squared_norms
    trace = cross_sq - float((sx * sy).sum())
    return trace + float(sx.sum() * sy.sum()) / ((n - 1) * (n - 2)) - 2 * float(sx @ sy) / (n - 2)


def cka_of_sides(x: CkaSide, y: CkaSide, debiased: bool = False) -> float:
    """Linear CKA of two prepared sides of the same N tokens (see :func:`linear_cka`)."""
    if x.n != y.n:
        raise ValueError(
            f"CKA compares two representations of the same tokens, row for row: got {x.n} and "
            f"{y.n} rows"
        )
    cross_sq = _cross_sq(x, y)
    denominator = x.self_hsic(debiased) * y.self_hsic(debiased)
    if not denominator > 0:
        return float("nan")  # a side with no spread (all rows equal) has no CKA
    return _hsic(cross_sq, x, y, debiased) / denominator**0.5


def linear_cka(X: Tensor, Y: Tensor, debiased: bool = False) -> float:
    """Linear CKA (Kornblith et al., 2019) of X [N, D1] and Y [N, D2], row i of each the same
    token: HSIC(X, Y) / sqrt(HSIC(X, X) HSIC(Y, Y)) with linear kernels, in [0, 1]; 1 when Y
    is X up to an orthogonal map, an isotropic scale and a shift. ``debiased``: Song et al.'s
    unbiased HSIC (Nguyen et al., 2021), for few tokens against wide layers (it can fall below
    0). NaN when X or Y has no spread. Float64 on the inputs' device; a ValueError for fewer
    than 4 rows, non-finite values or different row counts."""
    return cka_of_sides(CkaSide.of(X, "X"), CkaSide.of(Y, "Y"), debiased)


@dataclass(frozen=True)
class CkaOptions:
    """The CKA measures' parameter: ``debiased``, Song et al.'s unbiased HSIC."""

    debiased: bool = False


def _side(X: Tensor) -> CkaSide:
    return CkaSide.of(X, name="a layer's tokens")


@register_measure(
    CKA_DRIFT,
    kind="pair",
    pairing=DRIFT,
    params=CkaOptions,
    prepare=_side,
    info=MetricInfo(summary=True, shown=True),
)
def cka_drift(now: CkaSide, before: CkaSide, options: CkaOptions) -> dict[str, float]:
    """1 - CKA of a layer's tokens now against the same layer's at step 0."""
    return {CKA_DRIFT: 1.0 - cka_of_sides(now, before, options.debiased)}


@register_measure(CKA_PREV, kind="pair", pairing=PREVIOUS, params=CkaOptions, prepare=_side)
def cka_prev(layer: CkaSide, previous: CkaSide, options: CkaOptions) -> dict[str, float]:
    """CKA of a layer's tokens with those of the layer probed just before it."""
    return {CKA_PREV: cka_of_sides(layer, previous, options.debiased)}
