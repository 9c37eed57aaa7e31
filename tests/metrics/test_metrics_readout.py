"""The ridge readout: the same fit as scikit-learn's RidgeCV (leave-one-out over the same
penalties), recovers a planted linear signal and scores at chance on noise."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.linear_model import RidgeCV

from isoprobe.metrics.readout import RELATIVE_ALPHAS, ridge_readout


def _split(Z: np.ndarray, Y: np.ndarray, n_train: int):
    return [torch.as_tensor(a) for a in (Z[:n_train], Y[:n_train], Z[n_train:], Y[n_train:])]


def test_the_readout_is_ridge_cv_with_leave_one_out():
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(60, 12)) + 3.0
    Y = Z @ rng.normal(size=(12, 4)) * 0.3 + rng.normal(size=(60, 4)) + 1.0
    readout = ridge_readout(*_split(Z, Y, 40))
    centred = Z[:40] - Z[:40].mean(axis=0)
    scale = (np.linalg.svd(centred, compute_uv=False) ** 2).mean()
    sk = RidgeCV(alphas=[a * scale for a in RELATIVE_ALPHAS]).fit(Z[:40], Y[:40])
    assert readout.alpha == pytest.approx(sk.alpha_, rel=1e-12)
    predicted = sk.predict(Z[40:])
    nmse = ((predicted - Y[40:]) ** 2).mean() / (Y[40:] ** 2).mean()
    assert readout.nmse == pytest.approx(nmse, rel=1e-9)


def test_the_readout_recovers_a_planted_linear_signal():
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(64, 20))
    Y = Z @ rng.normal(size=(20, 6)) + 0.01 * rng.normal(size=(64, 6))
    readout = ridge_readout(*_split(Z, Y, 32))
    assert readout.nmse < 1e-3 and readout.skill > 0.999


def test_the_readout_scores_at_chance_on_noise():
    rng = np.random.default_rng(2)
    skills = []
    for _ in range(10):
        Z, Y = rng.normal(size=(200, 10)), rng.normal(size=(200, 5)) + 2.0
        readout = ridge_readout(*_split(Z, Y, 100))
        assert readout.nmse == pytest.approx(readout.chance_nmse, rel=0.1)
        skills.append(readout.skill)
    assert abs(np.mean(skills)) < 0.02


def test_too_few_windows_are_refused():
    with pytest.raises(ValueError, match="at least 3 training windows and 1 test window, got 2"):
        ridge_readout(torch.ones(2, 3), torch.ones(2, 1), torch.ones(1, 3), torch.ones(1, 1))
