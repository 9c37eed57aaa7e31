"""inter_token_cosine against brute force and on clouds whose mean cosine is known exactly."""

from __future__ import annotations

import math

import pytest
import torch

from isoprobe.metrics import inter_token_cosine


def test_equals_the_brute_force_mean_over_ordered_pairs(gaussian, brute_force_cosine):
    X = gaussian(300, 16) + 0.7
    X[[4, 90]] = 0.0  # zero rows have no direction: left out by both
    assert inter_token_cosine(X) == pytest.approx(brute_force_cosine(X.numpy()), abs=1e-12)
    centred = (X - X.mean(0)).numpy()
    assert inter_token_cosine(X, center=True) == pytest.approx(
        brute_force_cosine(centred), abs=1e-12
    )


def test_line_through_the_origin_gives_the_plus_minus_one_count():
    # p rows on one side of the origin, q on the other: pairs on one side have cosine +1,
    # across it -1, so the mean over ordered pairs is (p(p-1) + q(q-1) - 2pq) / (N(N-1)).
    p, q = 13, 7
    t = torch.cat([torch.linspace(0.5, 3, p), -torch.linspace(0.1, 2, q)]).double()
    X = t[:, None] * torch.tensor([[1.0, -2.0, 0.5, 3.0]], dtype=torch.float64)
    n = p + q
    expected = (p * (p - 1) + q * (q - 1) - 2 * p * q) / (n * (n - 1))
    assert inter_token_cosine(X) == pytest.approx(expected, abs=1e-14)
    assert inter_token_cosine(X[:p]) == pytest.approx(1.0, abs=1e-14)


def test_fewer_than_two_nonzero_rows_give_nan():
    assert math.isnan(inter_token_cosine(torch.zeros(5, 3)))
    one = torch.zeros(5, 3)
    one[2, 0] = 1.0
    assert math.isnan(inter_token_cosine(one))


def test_identical_rows_centre_to_zero_and_give_nan():
    X = torch.full((7, 5), 0.1, dtype=torch.float64)  # 0.1 is inexact: the mean must still cancel
    assert inter_token_cosine(X) == pytest.approx(1.0, abs=1e-14)
    assert math.isnan(inter_token_cosine(X, center=True))


def test_invariant_to_negation_row_order_and_scale(gaussian):
    X = gaussian(200, 8, seed=1) + 0.3
    value = inter_token_cosine(X)
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    assert inter_token_cosine(-X) == pytest.approx(value, abs=1e-14)
    assert inter_token_cosine(X[perm]) == pytest.approx(value, abs=1e-14)
    assert inter_token_cosine(X * 1e6) == pytest.approx(value, abs=1e-14)


def test_float32_input_is_measured_in_float64(gaussian):
    X = gaussian(100, 6, seed=2).float() + 1
    assert inter_token_cosine(X) == inter_token_cosine(X.double())


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="1 row"):
        inter_token_cosine(torch.ones(1, 3))
    with pytest.raises(ValueError, match="2-D"):
        inter_token_cosine(torch.ones(4))
    X = torch.ones(6, 3)
    X[1, 2] = float("nan")
    with pytest.raises(ValueError, match="1 of 6 rows holding NaN/inf"):
        inter_token_cosine(X)
