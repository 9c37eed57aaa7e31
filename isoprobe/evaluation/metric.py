"""Forecast metrics accumulated over batches (and ranks) from sufficient statistics."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from isoprobe.evaluation.forecast_metrics import mase_per_series, quantile_loss_sums


class ForecastMetrics(Metric):
    """NMSE, MSE, MAE, MASE and WQL from sums that add up across batches and DDP ranks, so the
    result equals the functional metrics on all forecasts at once."""

    full_state_update = False

    def __init__(self, quantile_levels: Sequence[float], season_length: int = 1) -> None:
        super().__init__()
        self.levels = tuple(float(q) for q in quantile_levels)
        self.season_length = int(season_length)
        for name in ("sq_error", "abs_error", "sq_target", "abs_target", "points", "mase_sum", "series"):
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state(
            "quantile_loss", torch.zeros(len(self.levels), dtype=torch.float64), dist_reduce_fx="sum"
        )

    def update(self, median: Tensor, quantiles: Tensor, target: Tensor, context: Tensor) -> None:
        error = median.double() - target.double()
        self.sq_error += error.square().sum()
        self.abs_error += error.abs().sum()
        self.sq_target += target.double().square().sum()
        self.abs_target += target.double().abs().sum()
        self.points += target.numel()
        self.mase_sum += mase_per_series(median, target, context, self.season_length).sum()
        self.series += target.shape[0]
        self.quantile_loss += quantile_loss_sums(quantiles, target, self.levels)

    def compute(self) -> dict[str, Tensor]:
        return {
            "nmse": self.sq_error / self.sq_target,
            "mse": self.sq_error / self.points,
            "mae": self.abs_error / self.points,
            "mase": self.mase_sum / self.series,
            "wql": (self.quantile_loss / self.abs_target).mean(),
        }
