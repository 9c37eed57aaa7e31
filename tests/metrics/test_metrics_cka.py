"""Linear CKA (Kornblith et al., 2019) and its debiased form (Song et al.'s unbiased HSIC):
the feature-space fast path equals the Gram-matrix definition in metrics.reference, has a known
value on a constructed pair, is 1 on a matrix against itself, and is invariant to orthogonal
maps, isotropic scaling and shifts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from isoprobe.metrics import linear_cka, reference


def _pair(n: int, d1: int, d2: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d1)) * np.logspace(0, -1.5, d1) + 4.0
    Y = np.tanh(X @ rng.normal(size=(d1, d2))) + 0.3 * rng.normal(size=(n, d2))
    return X, Y


@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize(("n", "d1", "d2"), [(60, 8, 5), (12, 30, 7), (9, 40, 25)])
def test_cka_equals_the_gram_matrix_definition(n, d1, d2, debiased):
    X, Y = _pair(n, d1, d2, seed=n + d1)
    fast = linear_cka(torch.as_tensor(X), torch.as_tensor(Y), debiased=debiased)
    # the reference works on the uncentred Gram matrices (X's offset of 4 included): the same
    # value, since both estimators ignore a shift, to the rounding of that offset
    assert fast == pytest.approx(reference.linear_cka(X, Y, debiased=debiased), abs=1e-10)


@pytest.mark.parametrize("debiased", [False, True])
def test_few_rows_against_wide_layers_go_through_the_gram_matrices_with_the_same_properties(
    debiased,
):
    # 10 rows, 64 and 48 columns: the N x N Gram path (fewer rows than either width)
    X, Y = _pair(10, 64, 48, seed=5)
    X, Y = torch.as_tensor(X), torch.as_tensor(Y)
    assert linear_cka(X, X, debiased=debiased) == 1.0
    Q, _ = torch.linalg.qr(
        torch.randn(64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    )
    base = linear_cka(X, Y, debiased=debiased)
    assert base == pytest.approx(
        reference.linear_cka(X.numpy(), Y.numpy(), debiased=debiased), abs=1e-10
    )
    assert linear_cka(X @ Q * 3.0, Y, debiased=debiased) == pytest.approx(base, abs=1e-12)


def test_cka_of_orthogonal_columns_has_its_closed_form():
    # centred, mutually orthogonal columns of squared norms a and b; Y keeps the first:
    # HSIC(X, Y) = a^2, HSIC(X, X) = a^2 + b^2, HSIC(Y, Y) = a^2, so CKA = a / sqrt(a^2 + b^2)
    columns = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]])
    X = np.repeat(columns, 5, axis=0) * np.array([3.0, 2.0])
    a, b = (X**2).sum(axis=0)
    expected = a / np.sqrt(a**2 + b**2)
    assert linear_cka(torch.as_tensor(X), torch.as_tensor(X[:, :1])) == pytest.approx(
        expected, abs=1e-14
    )
    assert reference.linear_cka(X, X[:, :1]) == pytest.approx(expected, abs=1e-14)


@pytest.mark.parametrize("debiased", [False, True])
def test_cka_of_a_matrix_with_itself_is_one_and_invariant(debiased):
    X, Y = _pair(80, 10, 6, seed=3)
    X, Y = torch.as_tensor(X), torch.as_tensor(Y)
    assert linear_cka(X, X, debiased=debiased) == 1.0
    Q, _ = torch.linalg.qr(
        torch.randn(10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    )
    base = linear_cka(X, Y, debiased=debiased)
    assert 0 < base < 1
    assert linear_cka(X @ Q, Y, debiased=debiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(X * 37.5, Y * 0.01, debiased=debiased) == pytest.approx(base, abs=1e-12)
    assert linear_cka(X - 100.0, Y + 3.0, debiased=debiased) == pytest.approx(base, abs=1e-10)
    assert linear_cka(X @ Q * 2.0, X, debiased=debiased) == pytest.approx(1.0, abs=1e-12)


def test_debiasing_removes_the_small_sample_bias_of_independent_clouds():
    rng = np.random.default_rng(0)
    biased, debiased = [], []
    for _ in range(20):
        X, Y = (
            torch.as_tensor(rng.normal(size=(30, 50))),
            torch.as_tensor(rng.normal(size=(30, 50))),
        )
        biased.append(linear_cka(X, Y))
        debiased.append(linear_cka(X, Y, debiased=True))
    # few tokens against wide layers: biased CKA of independent clouds is far from 0
    assert np.mean(biased) > 0.5
    assert abs(np.mean(debiased)) < 0.05


def test_cka_refuses_matrices_of_other_tokens_and_is_nan_without_spread():
    X = torch.randn(20, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="same tokens, row for row: got 20 and 19 rows"):
        linear_cka(X, X[:19])
    assert np.isnan(linear_cka(X, torch.ones(20, 3, dtype=torch.float64)))
