"""Point and probabilistic forecast metrics (METRICS.md, "Forecast metrics").

All functions take torch tensors: ``median`` / ``target`` [B, H], ``quantiles`` [B, Q, H],
``context`` [B, C] (NaN marks missing or left padding), and compute in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def nmse(median: Tensor, target: Tensor) -> float:
    """mean((y_hat - y)^2) / mean(y^2) over all series and steps: one global ratio, as the
    isotropy paper's authors compute it."""
    y, e = target.double(), median.double() - target.double()
    return float(e.square().mean() / y.square().mean())


def mse(median: Tensor, target: Tensor) -> float:
    return float((median.double() - target.double()).square().mean())


def mae(median: Tensor, target: Tensor) -> float:
    return float((median.double() - target.double()).abs().mean())


def seasonal_naive_scale(context: Tensor, season_length: int) -> Tensor:
    """Per series: mean |y_t - y_{t-m}| over the observed context (m = 1 when the context
    is too short for one season), the in-sample scale of MASE."""
    context = context.double()
    m = season_length if context.shape[-1] > season_length else 1
    diffs = (context[:, m:] - context[:, :-m]).abs()
    observed = ~diffs.isnan()
    return diffs.nan_to_num().sum(-1) / observed.sum(-1)


def mase_per_series(median: Tensor, target: Tensor, context: Tensor, season_length: int) -> Tensor:
    error = (median.double() - target.double()).abs().mean(-1)
    return error / seasonal_naive_scale(context, season_length)


def mase(median: Tensor, target: Tensor, context: Tensor, season_length: int) -> float:
    """Mean over series of MASE (Hyndman & Koehler 2006), as gluonts aggregates it."""
    return float(mase_per_series(median, target, context, season_length).mean())


def quantile_loss_sums(quantiles: Tensor, target: Tensor, levels: Sequence[float]) -> Tensor:
    """Per level q: 2 sum |(y - y_hat_q)(1{y <= y_hat_q} - q)| over all series and steps."""
    q = torch.as_tensor(levels, dtype=torch.float64, device=target.device).view(1, -1, 1)
    y = target.double().unsqueeze(1)
    pred = quantiles.double()
    return 2 * ((y - pred) * ((y <= pred).double() - q)).abs().sum(dim=(0, 2))


def wql(quantiles: Tensor, target: Tensor, levels: Sequence[float]) -> float:
    """Weighted quantile loss, Chronos' convention: mean over levels of the level's quantile
    loss divided by sum |y| (= gluonts' mean_wQuantileLoss)."""
    return float((quantile_loss_sums(quantiles, target, levels) / target.double().abs().sum()).mean())


def crps_from_samples(samples: Tensor, target: Tensor) -> float:
    """Sample CRPS, E|X - y| - E|X - X'|/2 per point, summed and divided by sum |y|."""
    x, y = samples.double(), target.double().unsqueeze(1)
    spread = (x.unsqueeze(1) - x.unsqueeze(2)).abs().mean(dim=(1, 2))
    crps = (x - y).abs().mean(1) - spread / 2
    return float(crps.sum() / target.double().abs().sum())
