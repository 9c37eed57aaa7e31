"""The rank-one downdate's eigenvalues against numpy's dense eigensolver, and its use for the
covariance spectrum inside probe_metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import isoprobe.metrics.spectrum as spectrum
from isoprobe.metrics import probe_metrics
from isoprobe.metrics._tokens import centre
from isoprobe.metrics.gram import feature_gram
from isoprobe.metrics.secular import rank_one_downdate_eigenvalues
from isoprobe.metrics.spectrum import (
    covariance_eigenvalues,
    covariance_eigenvalues_from_uncentred,
)


def dense_reference(diagonal: np.ndarray, z: np.ndarray) -> np.ndarray:
    return np.linalg.eigvalsh(np.diag(diagonal) - np.outer(z, z))


def assert_close_at_scale(ours: np.ndarray, reference: np.ndarray, diagonal, z) -> None:
    scale = max(np.abs(diagonal).max(), float(z @ z))
    assert np.abs(ours - reference).max() <= 1e-13 * scale


@pytest.mark.parametrize("dim", [1, 2, 7, 120])
def test_random_downdates_match_the_dense_eigenvalues(dim):
    rng = np.random.default_rng(dim)
    diagonal = np.sort(rng.normal(size=dim) * 10)
    z = rng.normal(size=dim) * 2
    ours = rank_one_downdate_eigenvalues(diagonal, z)
    assert_close_at_scale(ours, dense_reference(diagonal, z), diagonal, z)
    assert np.all(np.diff(ours) >= 0)


@pytest.mark.parametrize("case", ["plain", "repeated", "zeros", "tiny"])
def test_many_downdates_of_every_kind_match_the_dense_eigenvalues(case):
    """300 problems of 1 to 60 entries whose scales span six decades: as drawn, with entries
    rounded so that they repeat, with a third of z zero, or with z's entries spread over
    twelve decades (roots pressed against their poles)."""
    rng = np.random.default_rng(["plain", "repeated", "zeros", "tiny"].index(case))
    for _ in range(300):
        dim = int(rng.integers(1, 61))
        diagonal = np.sort(rng.normal(size=dim) * 10 ** rng.uniform(-3, 3))
        z = rng.normal(size=dim) * 10 ** rng.uniform(-3, 2)
        if case == "repeated":
            diagonal = np.sort(np.round(diagonal, 1))
        elif case == "zeros":
            z[rng.random(dim) < 0.3] = 0.0
        elif case == "tiny":
            z *= 10 ** rng.uniform(-12, 0, size=dim)
        ours = rank_one_downdate_eigenvalues(diagonal, z)
        assert_close_at_scale(ours, dense_reference(diagonal, z), diagonal, z)


def test_zero_components_and_repeated_entries():
    diagonal = np.array([0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0, 9.0])
    z = np.array([0.5, 0.0, 0.0, 1.0, 0.3, 0.0, 2.0, 0.0])
    ours = rank_one_downdate_eigenvalues(diagonal, z)
    # z is zero at 1 and 9, which stay eigenvalues; the brackets of the repeated entries are
    # empty: no 0/0 may reach the result
    assert np.all(np.isfinite(ours))
    assert_close_at_scale(ours, dense_reference(diagonal, z), diagonal, z)


def test_a_tiny_component_leaves_its_eigenvalue_in_place():
    diagonal = np.array([1.0, 2.0, 3.0, 4.0])
    z = np.array([1.0, 1e-150, 0.5, 0.2])
    ours = rank_one_downdate_eigenvalues(diagonal, z)
    assert_close_at_scale(ours, dense_reference(diagonal, z), diagonal, z)


def uncentred_decomposition(X: torch.Tensor):
    gram = feature_gram(centre(X))
    mean = X.mean(dim=0)
    values, vectors = torch.linalg.eigh(gram + X.shape[0] * mean[:, None] * mean[None, :])
    return gram, values, vectors, mean


@pytest.mark.parametrize("rank", [3, 40])
def test_covariance_spectrum_from_the_uncentred_decomposition(gaussian, rank):
    """A cloud of the given rank in 40 dimensions, with a common offset ten times its spread:
    the downdate gives the spectrum of the centred rows, zeros included."""
    X = gaussian(500, rank, seed=rank) @ torch.randn(rank, 40, dtype=torch.float64)
    X += 10 * X.std() * torch.randn(40, dtype=torch.float64)
    gram, values, vectors, mean = uncentred_decomposition(X)
    ours = covariance_eigenvalues_from_uncentred(values, vectors, mean, X.shape[0])
    reference = covariance_eigenvalues(gram, X.shape[0])
    assert ours is not None
    assert torch.allclose(ours, reference, rtol=0, atol=1e-11 * float(reference[0]))


def test_an_offset_that_dwarfs_the_spread_falls_back_to_the_centred_matrix(gaussian):
    X = gaussian(300, 6, seed=1) + 1e5
    _, values, vectors, mean = uncentred_decomposition(X)
    assert covariance_eigenvalues_from_uncentred(values, vectors, mean, X.shape[0]) is None
    reference = spectrum.effective_dimension(X), spectrum.isoscore(X)
    values = probe_metrics(X, {"metrics": ["eff_dim", "isoscore", "partition_ratio"]})
    assert (values["eff_dim"], values["isoscore"]) == pytest.approx(reference, rel=1e-9)


def test_probe_metrics_takes_the_covariance_spectrum_from_the_downdate(gaussian, monkeypatch):
    """With the partition ratio chosen, no second eigendecomposition runs for a usual cloud,
    and the values equal those of the centred eigendecomposition."""
    X = gaussian(400, 12, seed=3, scales=torch.linspace(3, 0.1, 12)) + 2.0
    expected = probe_metrics(X)
    calls = []
    dense = spectrum.covariance_eigenvalues
    monkeypatch.setattr(
        "isoprobe.metrics.suite.covariance_eigenvalues", lambda *a: calls.append(1) or dense(*a)
    )
    assert probe_metrics(X) == expected
    assert calls == []
    only_covariance = probe_metrics(X, {"metrics": ["eff_dim", "isoscore", "eps_rank_centred"]})
    assert calls == [1]
    for key, value in only_covariance.items():
        assert expected[key] == pytest.approx(value, rel=1e-10), key


def test_rows_with_an_exactly_zero_mean(gaussian):
    """Integer rows and their negatives: the mean is exactly zero, so z is, and X^T X is the
    centred matrix itself."""
    half = gaussian(150, 8, seed=4, scales=torch.linspace(20, 2, 8)).round()
    X = torch.cat([half, -half])
    assert bool((X.mean(dim=0) == 0).all())
    values = probe_metrics(X, {"metrics": ["eff_dim", "isoscore", "partition_ratio"]})
    reference = spectrum.effective_dimension(X), spectrum.isoscore(X)
    assert (values["eff_dim"], values["isoscore"]) == pytest.approx(reference, rel=1e-10)
