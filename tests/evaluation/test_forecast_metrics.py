"""Forecast metrics: exact values by hand, batch-wise accumulation, agreement with gluonts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from gluonts.evaluation import Evaluator
from gluonts.model.forecast import QuantileForecast

from isoprobe.evaluation import ForecastMetrics, crps_from_samples, mae, mase, mse, nmse, wql

LEVELS = (0.1, 0.5, 0.9)


def random_forecasts(seed: int = 0, batch: int = 6, horizon: int = 5, context: int = 20):
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randn(batch, context, generator=g, dtype=torch.float64).cumsum(-1) + 5
    target = torch.randn(batch, horizon, generator=g, dtype=torch.float64) + 5
    median = target + 0.5 * torch.randn(batch, horizon, generator=g, dtype=torch.float64)
    spread = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64).view(1, 3, 1)
    quantiles = median.unsqueeze(1) + spread
    return median, quantiles, target, ctx


def test_point_metrics_by_hand():
    target = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    median = torch.tensor([[2.0, 2.0], [3.0, 2.0]])
    assert nmse(median, target) == pytest.approx((1 + 0 + 0 + 4) / (1 + 4 + 9 + 16))
    assert mse(median, target) == pytest.approx(5 / 4)
    assert mae(median, target) == pytest.approx(3 / 4)
    context = torch.tensor([[0.0, 1.0, 3.0], [float("nan"), 2.0, 2.5]])
    # naive scales (m=1): mean(|1|, |2|) = 1.5 and |0.5| (the NaN pair is not observed)
    assert mase(median, target, context, 1) == pytest.approx(((1 / 2) / 1.5 + (2 / 2) / 0.5) / 2)


def test_wql_by_hand():
    target = torch.tensor([[2.0]])
    quantiles = torch.tensor([[[1.0], [3.0]]])  # levels 0.1, 0.9
    # q=0.1 at 1: 2*|(2-1)*(0-0.1)| = 0.2; q=0.9 at 3: 2*|(2-3)*(1-0.9)| = 0.2; / |y| = 2
    assert wql(quantiles, target, (0.1, 0.9)) == pytest.approx(0.1)


def test_crps_of_a_point_mass_is_the_absolute_error():
    samples = torch.full((1, 4, 2), 3.0)
    target = torch.tensor([[1.0, 2.0]])
    assert crps_from_samples(samples, target) == pytest.approx((2 + 1) / 3)


def test_accumulated_metric_equals_functions_on_all_forecasts():
    median, quantiles, target, ctx = random_forecasts()
    metric = ForecastMetrics(LEVELS, season_length=3)
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):
        metric.update(median[rows], quantiles[rows], target[rows], ctx[rows])
    out = {k: float(v) for k, v in metric.compute().items()}
    assert out["nmse"] == pytest.approx(nmse(median, target), rel=1e-12)
    assert out["mse"] == pytest.approx(mse(median, target), rel=1e-12)
    assert out["mae"] == pytest.approx(mae(median, target), rel=1e-12)
    assert out["mase"] == pytest.approx(mase(median, target, ctx, 3), rel=1e-12)
    assert out["wql"] == pytest.approx(wql(quantiles, target, LEVELS), rel=1e-12)


def test_agrees_with_gluonts_evaluator():
    median, quantiles, target, ctx = random_forecasts(seed=3)
    season = 4
    start = pd.Period("2020-01-01", freq="D")
    forecasts, series = [], []
    for i in range(len(target)):
        index = pd.period_range(start, periods=ctx.shape[1] + target.shape[1], freq="D")
        series.append(pd.DataFrame(torch.cat([ctx[i], target[i]]).numpy(), index=index))
        forecasts.append(
            QuantileForecast(
                forecast_arrays=quantiles[i].numpy(),
                start_date=index[ctx.shape[1]],
                forecast_keys=[str(q) for q in LEVELS],
            )
        )
    evaluator = Evaluator(quantiles=LEVELS, seasonality=season, num_workers=0)
    agg, _ = evaluator(iter(series), iter(forecasts), num_series=len(series))
    assert mse(median, target) == pytest.approx(agg["MSE"], rel=1e-9)
    assert mase(median, target, ctx, season) == pytest.approx(agg["MASE"], rel=1e-9)
    assert wql(quantiles, target, LEVELS) == pytest.approx(agg["mean_wQuantileLoss"], rel=1e-9)
    gluonts_nmse = agg["MSE"] / float(np.mean(target.numpy() ** 2))
    assert nmse(median, target) == pytest.approx(gluonts_nmse, rel=1e-9)
