"""effective_dimension, participation_ratio and isoscore against numpy's covariance spectrum and
the IsoScore package."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from IsoScore import IsoScore

from isoprobe.metrics import effective_dimension, isoscore, participation_ratio


def numpy_spectrum(X: torch.Tensor) -> np.ndarray:
    return np.sort(np.linalg.eigvalsh(np.cov(X.numpy(), rowvar=False)))[::-1]


def test_effective_dimension_and_participation_ratio_match_numpy(gaussian):
    X = gaussian(500, 20, scales=torch.logspace(0, -2, 20, dtype=torch.float64)) + 5.0
    lam = numpy_spectrum(X)
    cumulative = np.cumsum(lam) / lam.sum()
    for threshold in (0.3, 0.5, 0.8, 0.95, 0.999):
        assert np.abs(cumulative - threshold).min() > 1e-6  # no tie for rounding to break
        expected = int(np.searchsorted(cumulative, threshold) + 1)
        assert effective_dimension(X, threshold) == expected
    assert participation_ratio(X) == pytest.approx(lam.sum() ** 2 / (lam**2).sum(), rel=1e-10)


def test_effective_dimension_uses_the_full_spectrum_not_three_components(gaussian):
    X = gaussian(2000, 12)  # isotropic: 80 % of the variance needs about 10 of 12 axes
    cumulative = np.cumsum(numpy_spectrum(X))
    cumulative /= cumulative[-1]
    assert np.abs(cumulative - 0.8).min() > 1e-6  # no tie for rounding to break
    expected = int(np.searchsorted(cumulative, 0.8) + 1)
    assert expected > 3
    assert effective_dimension(X) == expected


@pytest.mark.parametrize("last_scale", [0.05, 0.5, 1.0, 4.0])
def test_isoscore_agrees_with_the_isoscore_package(gaussian, last_scale):
    X = gaussian(800, 10, scales=torch.linspace(1, last_scale, 10, dtype=torch.float64))
    reference = float(IsoScore.IsoScore(X.numpy()))  # rows = points, as its docstring says
    assert isoscore(X) == pytest.approx(reference, abs=1e-6)  # it takes sqrt(D) in float32


def test_isotropic_gaussian_scores_near_one(gaussian):
    X = gaussian(4000, 16, seed=3)
    assert isoscore(X) > 0.95
    assert participation_ratio(X) > 0.9 * 16


def test_a_line_has_one_dimension_and_zero_isoscore():
    t = torch.linspace(-1, 1, 200, dtype=torch.float64)[:, None]
    direction = torch.randn(1, 24, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    X = t * direction + 7.0
    assert effective_dimension(X) == 1
    assert effective_dimension(X, threshold=1.0) == 1
    assert participation_ratio(X) == pytest.approx(1.0, abs=1e-9)
    assert isoscore(X) == pytest.approx(0.0, abs=1e-9)


def test_identical_rows_have_zero_dimension_ratio_and_score():
    X = torch.full((30, 6), 0.1, dtype=torch.float64)
    assert effective_dimension(X) == 0
    assert participation_ratio(X) == 0.0
    assert isoscore(X) == 0.0


def test_spectral_measures_ignore_negation_and_row_order(gaussian):
    X = gaussian(300, 8, seed=4, scales=torch.linspace(2, 0.1, 8, dtype=torch.float64))
    perm = torch.randperm(300, generator=torch.Generator().manual_seed(1))
    for Y in (-X, X[perm]):
        assert effective_dimension(Y) == effective_dimension(X)
        assert participation_ratio(Y) == pytest.approx(participation_ratio(X), rel=1e-12)
        assert isoscore(Y) == pytest.approx(isoscore(X), abs=1e-12)


def test_threshold_outside_zero_one_is_refused(gaussian):
    with pytest.raises(ValueError, match="threshold"):
        effective_dimension(gaussian(10, 3), threshold=1.5)
