"""A linear readout of the forecast from one layer: how much of the horizon a layer already
holds (a "lens" in the sense of tsfm-lens, fitted rather than borrowed from the head).

Ridge regression from each probe window's pooled representation z [D] (the mean of its real
tokens in the layer) to its scaled horizon y [H], fitted on one part of the windows and scored on
the other. The penalty is chosen among :data:`RELATIVE_ALPHAS` times the mean squared singular
value of the centred training features by exact leave-one-out error (the ridge hat matrix
H = 11^T / n + U diag(s^2 / (s^2 + a)) U^T, residuals divided by 1 - H_ii; the intercept is not
penalised), as scikit-learn's ``RidgeCV`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from isoprobe.metrics.registry import MetricInfo, register_measure

#: the readout's test error per layer: where in depth the forecast forms (task=analyze's depth)
READOUT_NMSE = "readout_nmse"
#: 1 - the readout's NMSE / that of predicting the training windows' mean horizon
READOUT_SKILL = "readout_skill"

#: the ridge penalties tried, relative to the mean squared singular value of the features
RELATIVE_ALPHAS = tuple(10.0**k for k in range(-4, 5))


@dataclass(frozen=True)
class Readout:
    """A readout's test error: ``nmse`` = mean((y_hat - y)^2) / mean(y^2) over test windows x
    horizon steps (isoprobe's NMSE), ``chance_nmse`` that of predicting the training windows'
    mean horizon, ``skill`` = 1 - nmse / chance_nmse (0: no better than chance, 1: exact), and
    the penalty ``alpha`` leave-one-out chose."""

    nmse: float
    chance_nmse: float
    skill: float
    alpha: float


def ridge_readout(
    train_features: Tensor, train_targets: Tensor, test_features: Tensor, test_targets: Tensor
) -> Readout:
    """Fit ridge on (``train_features`` [n, D], ``train_targets`` [n, H]) with the penalty of
    least leave-one-out error, and score it on the test pair (module docstring). Float64."""
    Z, Y = train_features.double(), train_targets.double()
    Zt, Yt = test_features.double(), test_targets.double()
    n = Z.shape[0]
    if n < 3 or Zt.shape[0] < 1:
        raise ValueError(
            f"a readout needs at least 3 training windows and 1 test window, got {n} and "
            f"{Zt.shape[0]} (probe more windows: num_windows)"
        )
    z_mean, y_mean = Z.mean(dim=0), Y.mean(dim=0)
    U, s, Vh = torch.linalg.svd(Z - z_mean, full_matrices=False)
    Uy = U.T @ (Y - y_mean)
    scale = float((s * s).mean()) or 1.0
    best: tuple[float, float] | None = None
    for relative in RELATIVE_ALPHAS:
        alpha = relative * scale
        shrink = s * s / (s * s + alpha)
        residual = (Y - y_mean) - U @ (shrink[:, None] * Uy)
        leverage = 1.0 / n + (U * U) @ shrink
        loo = float((residual / (1.0 - leverage).clamp_min(1e-12)[:, None]).pow(2).mean())
        if best is None or loo < best[0]:
            best = (loo, alpha)
    alpha = best[1]
    coef = Vh.T @ ((s / (s * s + alpha))[:, None] * Uy)
    predicted = y_mean + (Zt - z_mean) @ coef
    power = float(Yt.pow(2).mean())
    nmse = float((predicted - Yt).pow(2).mean()) / power
    chance = float((y_mean - Yt).pow(2).mean()) / power
    return Readout(nmse, chance, 1.0 - nmse / chance, alpha)


@dataclass(frozen=True)
class ReadoutOptions:
    """The readout's parameter: ``train_fraction``, the share of the probe windows (the first,
    in probe-set order) it is fitted on; the rest score it."""

    train_fraction: float = 0.5

    def __post_init__(self) -> None:
        if not 0 < self.train_fraction < 1:
            raise ValueError(
                f"readout.train_fraction must lie in (0, 1) (the rest of the windows score the "
                f"readout), got {self.train_fraction}"
            )


@register_measure(
    "readout",
    (READOUT_NMSE, READOUT_SKILL),
    kind="windows",
    params=ReadoutOptions,
    info={
        READOUT_NMSE: MetricInfo(
            direction=-1, summary=True, log_scale=True, shown=True, forecast=True
        ),
        READOUT_SKILL: MetricInfo(direction=1, forecast=True),
    },
)
def readout(features: Tensor, targets: Tensor, options: ReadoutOptions) -> dict[str, float]:
    """:func:`ridge_readout` of ``targets`` [W, H] from ``features`` [W, D], fitted on the first
    ``train_fraction`` of the windows and scored on the rest; windows with a non-finite feature
    or target are left out (a ValueError where too few are left)."""
    n_train = math.ceil(options.train_fraction * len(targets))
    usable = torch.isfinite(targets).all(dim=1) & torch.isfinite(features).all(dim=1)
    train, test = usable.clone(), usable.clone()
    train[n_train:], test[:n_train] = False, False
    fitted = ridge_readout(features[train], targets[train], features[test], targets[test])
    return {READOUT_NMSE: fitted.nmse, READOUT_SKILL: fitted.skill}
