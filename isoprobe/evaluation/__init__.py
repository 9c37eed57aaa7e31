"""Forecast evaluation: NMSE (the isotropy paper's global ratio), MSE, MAE, MASE, WQL, CRPS."""

from isoprobe.evaluation.forecast_metrics import (
    crps_from_samples,
    mae,
    mase,
    mase_per_window,
    mse,
    nmse,
    quantile_loss_sums,
    seasonal_naive_scale,
    wql,
)
from isoprobe.evaluation.metric import ForecastMetrics

__all__ = [
    "ForecastMetrics",
    "crps_from_samples",
    "mae",
    "mase",
    "mase_per_window",
    "mse",
    "nmse",
    "quantile_loss_sums",
    "seasonal_naive_scale",
    "wql",
]
