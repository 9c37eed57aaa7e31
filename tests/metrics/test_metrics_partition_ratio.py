"""partition_ratio: closed forms, an mpmath reference at norms that overflow exp, invariances."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch

from isoprobe.metrics import partition_ratio


def test_axis_cross_has_the_closed_form_ratio():
    # rows +-a_i e_i: X^T X = diag(2 a_i^2), so c = +-e_i and Z(+-e_i) = 2 cosh(a_i) + 2 (D - 1).
    # exp(800) overflows float64; the logs of Z do not.
    a = [800.0, 5.0, 1.0]
    X = torch.cat([torch.diag(torch.tensor(a)), -torch.diag(torch.tensor(a))]).double()
    log_z = [ai + math.log1p(math.exp(-2 * ai) + 2 * (len(a) - 1) * math.exp(-ai)) for ai in a]
    result = partition_ratio(X)
    assert result.log_ratio == pytest.approx(min(log_z) - max(log_z), rel=1e-13)
    assert result.ratio == math.exp(result.log_ratio)


def test_huge_norms_match_an_arbitrary_precision_sum(gaussian):
    X = gaussian(150, 6) * 1e4 + 3e4  # <c, x> reaches ~1e5: exp overflows by far
    result = partition_ratio(X)
    assert math.isfinite(result.log_ratio) and result.log_ratio < 0
    _, V = np.linalg.eigh(X.numpy().T @ X.numpy())
    projections = X.numpy() @ np.concatenate([V, -V], axis=1)
    with mpmath.workdps(40):
        log_z = [
            float(mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(p)) for p in column)))
            for column in projections.T
        ]
    assert result.log_ratio == pytest.approx(min(log_z) - max(log_z), rel=1e-9)


def test_identical_rows_give_minus_twice_the_norm():
    # X^T X = N x x^T: Z(+-x/|x|) = N exp(+-|x|), every other eigenvector gives N.
    x = torch.tensor([3.0, -4.0, 12.0], dtype=torch.float64)  # |x| = 13
    result = partition_ratio(x.expand(25, 3))
    assert result.log_ratio == pytest.approx(-26.0, rel=1e-12)


def test_isotropic_cloud_is_near_one_and_an_offset_pulls_it_down(gaussian):
    # For N rows of N(0, s^2 I), Z(c) / N estimates E exp(s z) = exp(s^2 / 2) with relative
    # spread sqrt((exp(s^2) - 1) / N): 0.02 at s = 1, 0.0016 at s = 0.1 (N = 4000). Over the
    # 32 directions, picked by the data, min and max log Z stay a few spreads apart.
    X = gaussian(4000, 16, seed=5)
    assert partition_ratio(X).ratio > 0.75
    assert partition_ratio(0.1 * X).ratio > 0.98
    shifted = [partition_ratio(X + shift).ratio for shift in (0.5, 1.0, 2.0)]
    assert shifted[0] > shifted[1] > shifted[2]
    assert shifted[2] < 0.01


def test_invariant_to_negation_and_row_order(gaussian):
    X = gaussian(300, 8, seed=6) + torch.tensor([2.0] + [0.0] * 7, dtype=torch.float64)
    reference = partition_ratio(X).log_ratio
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(2))
    assert partition_ratio(-X).log_ratio == pytest.approx(reference, rel=1e-10)
    assert partition_ratio(X[perm]).log_ratio == pytest.approx(reference, rel=1e-10)
