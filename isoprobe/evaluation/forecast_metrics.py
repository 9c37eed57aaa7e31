"""Point and probabilistic forecast metrics: NMSE (the isotropy paper's), MSE, MAE, MASE and
WQL (the rank-structure paper's, over ``levels``), each defined in its function's docstring.

All functions take torch tensors and compute in float64: ``median`` and ``target`` [B, H] (B
windows, H horizon steps), ``quantiles`` [B, Q, H] at ``levels``, ``samples`` [B, S, H],
``context`` [B, C]. They return 0-dim float64 tensors.

Missing values, as gluonts' evaluation treats them (``ignore_invalid_values``): a NaN target
step is left out of every sum and count; NaN context values (left padding, or gaps) are left out
of MASE's scale. A NaN *forecast* at an observed step is not masked: it makes the metric NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def _check_point_forecast(median: Tensor, target: Tensor) -> None:
    if target.dim() != 2:
        raise ValueError(f"target must be [windows, horizon], got shape {tuple(target.shape)}")
    if median.shape != target.shape:
        raise ValueError(
            f"median forecast shape {tuple(median.shape)} differs from the target's "
            f"{tuple(target.shape)}; both must be [windows, horizon]"
        )


def _check_quantiles(quantiles: Tensor, target: Tensor, levels: Sequence[float]) -> None:
    expected = (target.shape[0], len(levels), target.shape[1])
    if tuple(quantiles.shape) != expected:
        raise ValueError(
            f"quantile forecasts must be [windows, levels, horizon] = {expected} for "
            f"{len(levels)} levels, got {tuple(quantiles.shape)}"
        )
    if any(not 0 < q < 1 for q in levels):
        raise ValueError(f"quantile levels must lie in (0, 1), got {list(levels)}")


def _check_context(context: Tensor, target: Tensor, season_length: int) -> None:
    if context.dim() != 2 or context.shape[0] != target.shape[0]:
        raise ValueError(
            f"context must be [windows, context length] with {target.shape[0]} windows, got "
            f"shape {tuple(context.shape)}"
        )
    if int(season_length) != season_length or season_length < 1:
        raise ValueError(f"season_length must be a positive integer, got {season_length!r}")


def _observed(target: Tensor) -> Tensor:
    return ~target.isnan()


def _masked(values: Tensor, observed: Tensor) -> Tensor:
    """``values`` with the steps of unobserved targets set to 0 (NaN forecasts kept)."""
    return torch.where(observed, values, torch.zeros((), dtype=values.dtype))


def squared_error_sum(median: Tensor, target: Tensor) -> Tensor:
    _check_point_forecast(median, target)
    error = median.double() - target.double()
    return _masked(error.square(), _observed(target)).sum()


def absolute_error_sum(median: Tensor, target: Tensor) -> Tensor:
    _check_point_forecast(median, target)
    error = median.double() - target.double()
    return _masked(error.abs(), _observed(target)).sum()


def squared_target_sum(target: Tensor) -> Tensor:
    return target.double().nan_to_num(nan=0.0).square().sum()


def absolute_target_sum(target: Tensor) -> Tensor:
    return target.double().nan_to_num(nan=0.0).abs().sum()


def observed_count(target: Tensor) -> Tensor:
    return _observed(target).sum().double()


def nmse(median: Tensor, target: Tensor) -> Tensor:
    """mean((y_hat - y)^2) / mean(y^2) over all windows and steps: one global ratio, as the
    isotropy paper's authors compute it, y_hat the median forecast."""
    return squared_error_sum(median, target) / squared_target_sum(target)


def mse(median: Tensor, target: Tensor) -> Tensor:
    """Mean squared error of the median over all observed (window, step) points."""
    return squared_error_sum(median, target) / observed_count(target)


def mae(median: Tensor, target: Tensor) -> Tensor:
    """Mean absolute error of the median over all observed (window, step) points."""
    return absolute_error_sum(median, target) / observed_count(target)


def _mean_lag_difference(context: Tensor, lag: int) -> Tensor:
    """Per window: mean |y_t - y_{t-lag}| over the pairs whose two values are observed."""
    if lag >= context.shape[-1]:
        return torch.full(context.shape[:1], torch.nan, dtype=torch.float64, device=context.device)
    diffs = (context[:, lag:] - context[:, :-lag]).abs()
    pairs = ~diffs.isnan()
    return diffs.nan_to_num(nan=0.0).sum(-1) / pairs.sum(-1)


def seasonal_naive_scale(context: Tensor, season_length: int) -> Tensor:
    """[B] MASE's in-sample scale: mean |y_t - y_{t-m}| over the context (Hyndman & Koehler
    2006), pairs with a NaN left out. Like gluonts, m falls back to 1 for a context of at most m
    values; the context's length is counted from its first observed value (left padding aside).
    NaN for a window with no observed pair."""
    context = context.double()
    observed = ~context.isnan()
    first = torch.where(observed.any(-1), observed.double().argmax(-1), context.shape[-1])
    length = context.shape[-1] - first
    seasonal = _mean_lag_difference(context, season_length)
    naive = _mean_lag_difference(context, 1)
    return torch.where(length > season_length, seasonal, naive)


def mase_per_window(
    median: Tensor, target: Tensor, context: Tensor, season_length: int
) -> tuple[Tensor, Tensor]:
    """([B] MASE of each window, [B] bool: whether it is defined).

    A window's MASE is its mean absolute error over the observed target steps divided by
    :func:`seasonal_naive_scale`. It is undefined (and left out of means) when the scale is 0 or
    NaN (a constant or unobserved context) or no target step is observed; gluonts gives inf or
    NaN there, and its ``aggregate_valid`` leaves such windows out the same way.
    """
    _check_point_forecast(median, target)
    _check_context(context, target, season_length)
    observed = _observed(target)
    count = observed.sum(-1)
    error = _masked((median.double() - target.double()).abs(), observed).sum(-1)
    scale = seasonal_naive_scale(context, season_length)
    defined = (count > 0) & (scale > 0) & scale.isfinite()
    value = error / (count.clamp(min=1) * torch.where(defined, scale, 1.0))
    return torch.where(defined, value, torch.nan), defined


def mase(median: Tensor, target: Tensor, context: Tensor, season_length: int) -> Tensor:
    """Mean over windows of MASE (seasonal naive scale from each window's context), the
    aggregation of gluonts' ``Evaluator``; windows whose MASE is undefined are left out."""
    values, defined = mase_per_window(median, target, context, season_length)
    return values[defined].sum() / defined.sum()


def quantile_loss_sums(quantiles: Tensor, target: Tensor, levels: Sequence[float]) -> Tensor:
    """[Q] per level q: sum over observed points of 2 |(y - y_q) (1{y <= y_q} - q)|, gluonts'
    quantile loss."""
    _check_quantiles(quantiles, target, levels)
    q = torch.tensor(levels, dtype=torch.float64, device=target.device).view(1, -1, 1)
    y = target.double().unsqueeze(1)
    pred = quantiles.double()
    loss = 2 * ((y - pred) * ((y <= pred).double() - q)).abs()
    return _masked(loss, _observed(y)).sum(dim=(0, 2))


def wql(quantiles: Tensor, target: Tensor, levels: Sequence[float]) -> Tensor:
    """Mean weighted quantile loss (Chronos' WQL, gluonts' ``mean_wQuantileLoss`` and
    ``MeanWeightedSumQuantileLoss``): the mean over levels of sum of quantile losses / sum |y|."""
    return (quantile_loss_sums(quantiles, target, levels) / absolute_target_sum(target)).mean()


def crps_from_samples(samples: Tensor, target: Tensor) -> Tensor:
    """Weighted CRPS of sample forecasts: sum over observed points of the CRPS of the samples'
    empirical distribution, divided by sum |y| (normalised like :func:`wql`, which approximates
    it on a grid of levels).

    Per point, with the S samples sorted, x_(1) <= ... <= x_(S), the CRPS of their empirical
    distribution is exactly (energy form) mean_i |x_i - y| - 1/(2 S^2) sum_{i,j} |x_i - x_j|,
    and sum_{i,j} |x_i - x_j| = 2 sum_i (2i - S - 1) x_(i).
    """
    if (
        samples.dim() != 3
        or samples.shape[0] != target.shape[0]
        or (samples.shape[2] != target.shape[-1])
    ):
        raise ValueError(
            f"samples must be [windows, samples, horizon] = [{target.shape[0]}, S, "
            f"{target.shape[-1]}], got {tuple(samples.shape)}"
        )
    x, y = samples.double(), target.double()
    size = x.shape[1]
    ranks = torch.arange(1, size + 1, dtype=torch.float64, device=x.device).view(1, -1, 1)
    spread = 2 * ((2 * ranks - size - 1) * x.sort(dim=1).values).sum(1)
    crps = (x - y.unsqueeze(1)).abs().mean(1) - spread / (2 * size**2)
    return _masked(crps, _observed(y)).sum() / absolute_target_sum(target)
