"""The signals of figure 2 are the families they are said to be, and the spectrum of an
embedded-input matrix is read exactly."""

from __future__ import annotations

import math

import pytest
import torch

from isoprobe.spectra.signals import FAMILIES, diverse_signals, family_series
from isoprobe.spectra.spectrum import embedding_spectrum

LENGTH = 200


def rows(family: str, count: int = 20) -> torch.Tensor:
    return family_series(family, count, LENGTH, torch.Generator().manual_seed(3)).double()


def test_sinusoids_obey_the_two_term_recurrence_of_a_shifted_sine():
    """c + a sin(ωt + φ) satisfies y[t+1] + y[t-1] = 2 cos(ω) y[t] + 2c (1 - cos ω): the
    columns [y[t+1] + y[t-1], y[t], 1] are linearly dependent; noise would not be."""
    for family, dependent in (("sinusoid", True), ("white_noise", False)):
        for y in rows(family):
            columns = torch.stack([y[2:] + y[:-2], y[1:-1], torch.ones(LENGTH - 2)], dim=1)
            sigma = torch.linalg.svdvals(columns.float())
            assert (sigma[-1] / sigma[0] < 1e-4) == dependent, family


def test_exponentials_have_geometric_differences():
    """a exp(r t / T) + c: consecutive differences shrink or grow by the one factor exp(r/T)
    (to the float32 rounding of the values), and that rate lies in the stated range [-5, 5]."""
    for y in rows("exponential"):
        steps = torch.diff(y)
        ratios = steps[1:] / steps[:-1]
        factor = ratios.median()
        reliable = steps[:-1].abs() > 1e-3 * y.abs().max()  # where rounding is negligible
        assert torch.allclose(ratios[reliable], factor.expand(int(reliable.sum())), rtol=1e-3)
        assert abs(math.log(float(factor)) * LENGTH) <= 5 + 1e-2
    noise = rows("white_noise")
    ratios = torch.diff(noise)[:, 1:] / torch.diff(noise)[:, :-1]
    assert (ratios.std(dim=1) > 0.5).all()  # noise has no such factor


def test_white_noise_is_uncorrelated_from_step_to_step():
    y = rows("white_noise", 200)
    centred = y - y.mean(dim=1, keepdim=True)
    lag1 = (centred[:, 1:] * centred[:, :-1]).sum(1) / centred.pow(2).sum(1)
    assert lag1.abs().mean() < 2 / math.sqrt(LENGTH)


def test_signals_hold_each_family_equally_and_repeat_with_the_seed():
    series, names = diverse_signals(5, 64, seed=1)
    assert series.shape == (15, 64) and names == [f for f in FAMILIES for _ in range(5)]
    assert torch.equal(series, diverse_signals(5, 64, seed=1)[0])
    assert not torch.equal(series, diverse_signals(5, 64, seed=2)[0])
    with pytest.raises(ValueError, match="unknown signal family 'chirp'"):
        family_series("chirp", 2, 8, torch.Generator())


def test_spectrum_of_a_matrix_with_known_singular_values():
    """Ξ = U diag(s) Vᵀ: σᵢ/σ₁ is s/s₁, the ε-rank counts s/s₁ ≥ ε, and the rows' coordinates
    on the two leading singular vectors are U[:, :2] diag(s[:2]) up to each vector's sign."""
    generator = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(300, 40, generator=generator, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(40, 40, generator=generator, dtype=torch.float64))
    s = 10.0 ** -torch.arange(40, dtype=torch.float64).div(4)  # 1, 0.56, 0.32, ...
    spectrum = embedding_spectrum(u @ torch.diag(s) @ v.T)
    assert spectrum.shape == (300, 40)
    assert torch.allclose(spectrum.relative, s / s[0], rtol=1e-9, atol=1e-15)
    for eps in (0.4, 0.008, 3e-5):  # between consecutive s/s₁, away from ties
        assert spectrum.epsilon_rank(eps) == int((s / s[0] >= eps).sum())
    expected = u[:, :2] * s[:2]
    for k in range(2):
        assert torch.allclose(spectrum.projection[:, k].abs(), expected[:, k].abs(), atol=1e-10)


def test_spectrum_refuses_what_has_none():
    with pytest.raises(ValueError, match="all zero"):
        embedding_spectrum(torch.zeros(5, 3))
    with pytest.raises(ValueError, match=r"\[n, d\] matrix"):
        embedding_spectrum(torch.ones(5))
