"""Forecast metrics accumulated over batches (and DDP ranks) from sufficient statistics."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from isoprobe.evaluation.forecast_metrics import (
    absolute_error_sum,
    absolute_target_sum,
    mase_per_window,
    observed_count,
    quantile_loss_sums,
    squared_error_sum,
    squared_target_sum,
)

DEFAULT_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
_SUMS = (
    "squared_error",
    "absolute_error",
    "squared_target",
    "absolute_target",
    "observed",
    "mase_sum",
    "mase_windows",
)


class ForecastMetrics(Metric):
    """NMSE, MSE, MAE, MASE and WQL of median and quantile forecasts.

    Every state is a float64 sum (``dist_reduce_fx="sum"``), so batches and DDP ranks add up and
    :meth:`compute` equals the functions of :mod:`isoprobe.evaluation.forecast_metrics` on all
    forecasts at once: sums of squared / absolute errors, of y^2 and |y|, the count of observed
    target points, the sum and count of defined per-window MASEs, and per level the quantile loss.

    Args:
        quantile_levels: the levels of the quantile forecasts passed to :meth:`update`.
        season_length: MASE's seasonal period m, in steps.
    """

    full_state_update = False
    higher_is_better = False

    def __init__(
        self, quantile_levels: Sequence[float] = DEFAULT_LEVELS, season_length: int = 1
    ) -> None:
        super().__init__()
        self.levels = tuple(float(q) for q in quantile_levels)
        if not self.levels or any(not 0 < q < 1 for q in self.levels):
            raise ValueError(f"quantile_levels must be levels in (0, 1), got {quantile_levels}")
        if int(season_length) != season_length or season_length < 1:
            raise ValueError(f"season_length must be a positive integer, got {season_length!r}")
        self.season_length = int(season_length)
        for name in _SUMS:
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state(
            "quantile_loss",
            torch.zeros(len(self.levels), dtype=torch.float64),
            dist_reduce_fx="sum",
        )

    def update(self, median: Tensor, quantiles: Tensor, target: Tensor, context: Tensor) -> None:
        """Add a batch: ``median`` and ``target`` [B, H], ``quantiles`` [B, Q, H] at the
        metric's levels, ``context`` [B, C] (for MASE's scale), all in the data's units."""
        values, defined = mase_per_window(median, target, context, self.season_length)
        increments = {
            "squared_error": squared_error_sum(median, target),
            "absolute_error": absolute_error_sum(median, target),
            "squared_target": squared_target_sum(target),
            "absolute_target": absolute_target_sum(target),
            "observed": observed_count(target),
            "mase_sum": values[defined].sum(),
            "mase_windows": defined.sum().double(),
            "quantile_loss": quantile_loss_sums(quantiles, target, self.levels),
        }
        # every input is checked before any state changes
        for name, increment in increments.items():
            setattr(self, name, getattr(self, name) + increment)

    def compute(self) -> dict[str, Tensor]:
        return {
            "nmse": self.squared_error / self.squared_target,
            "mse": self.squared_error / self.observed,
            "mae": self.absolute_error / self.observed,
            "mase": self.mase_sum / self.mase_windows,
            "wql": (self.quantile_loss / self.absolute_target).mean(),
        }
