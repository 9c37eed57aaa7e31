"""Forecast evaluation: NMSE (the isotropy paper's global ratio), MSE, MAE, MASE, WQL, CRPS."""

from isoprobe.evaluation.forecast_metrics import (
    crps_from_samples,
    mae,
    mase,
    mse,
    nmse,
    seasonal_naive_scale,
    wql,
)
from isoprobe.evaluation.metric import ForecastMetrics

__all__ = [
    "ForecastMetrics",
    "crps_from_samples",
    "mae",
    "mase",
    "mse",
    "nmse",
    "seasonal_naive_scale",
    "wql",
]
