"""Forecast metrics: exact values by hand, batch-wise and DDP accumulation, agreement with gluonts
(``gluonts.evaluation.Evaluator`` and ``gluonts.ev``), missing values."""

from __future__ import annotations

import os
import socket

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gluonts.ev.metrics import MASE, MSE, MeanWeightedSumQuantileLoss
from gluonts.ev.ts_stats import seasonal_error
from gluonts.evaluation import Evaluator
from gluonts.evaluation._base import aggregate_valid
from gluonts.model.forecast import QuantileForecast

from isoprobe.evaluation import (
    ForecastMetrics,
    crps_from_samples,
    mae,
    mase,
    mse,
    nmse,
    seasonal_naive_scale,
    wql,
)

# gluonts' own chatter about the masked (missing) values it converts to NaN
pytestmark = pytest.mark.filterwarnings(
    "ignore:Warning. converting a masked element to nan:UserWarning"
)

LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
NAN = float("nan")


def random_forecasts(seed: int = 0, batch: int = 12, horizon: int = 7, context: int = 30):
    """Random-walk contexts, targets around 5, a noisy median and ordered quantiles around it."""
    g = torch.Generator().manual_seed(seed)
    ctx = torch.randn(batch, context, generator=g, dtype=torch.float64).cumsum(-1) + 5
    target = torch.randn(batch, horizon, generator=g, dtype=torch.float64) + 5
    median = target + 0.5 * torch.randn(batch, horizon, generator=g, dtype=torch.float64)
    offsets = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(LEVELS, dtype=torch.float64))
    width = 0.5 + torch.rand(batch, 1, horizon, generator=g, dtype=torch.float64)
    quantiles = median.unsqueeze(1) + offsets.view(1, -1, 1) * width
    return median, quantiles, target, ctx


def evaluator_metrics(median, quantiles, target, contexts, season, **options) -> dict:
    """gluonts' Evaluator on the same forecasts (QuantileForecast, one series per window);
    ``contexts`` is a list of 1-D histories (their lengths may differ)."""
    forecasts, series = [], []
    for i in range(len(target)):
        history = torch.as_tensor(contexts[i], dtype=torch.float64)
        values = torch.cat([history, target[i]]).numpy()
        index = pd.period_range("2020-01-01", periods=len(values), freq="D")
        series.append(pd.DataFrame(values, index=index))
        forecasts.append(
            QuantileForecast(
                forecast_arrays=quantiles[i].numpy(),
                start_date=index[len(history)],
                forecast_keys=[str(q) for q in LEVELS],
            )
        )
    evaluator = Evaluator(quantiles=LEVELS, seasonality=season, num_workers=0, **options)
    aggregate, _ = evaluator(iter(series), iter(forecasts), num_series=len(series))
    return aggregate


def test_point_metrics_by_hand():
    target = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    median = torch.tensor([[2.0, 2.0], [3.0, 2.0]])
    # errors 1, 0, 0, -2; squares 1, 0, 0, 4; targets^2 1, 4, 9, 16
    assert float(nmse(median, target)) == pytest.approx(5 / 30)
    assert float(mse(median, target)) == pytest.approx(5 / 4)
    assert float(mae(median, target)) == pytest.approx(3 / 4)
    assert nmse(median, target).dtype == torch.float64


def test_mase_by_hand_with_season_fallback_and_padding():
    target = torch.tensor([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    median = torch.tensor([[2.0, 2.0], [3.0, 2.0], [1.0, 1.0]])
    context = torch.tensor(
        [
            [0.0, 1.0, 3.0, 6.0],  # m = 2: |3 - 0|, |6 - 1| -> scale 4
            [NAN, NAN, 2.0, 2.5],  # 2 observed values <= m: m = 1, |2.5 - 2| -> scale 0.5
            [1.0, NAN, 2.0, 4.0],  # m = 2: |2 - 1| (the pair with the gap is skipped) -> 1
        ]
    )
    scale = seasonal_naive_scale(context, 2)
    torch.testing.assert_close(scale, torch.tensor([4.0, 0.5, 1.0], dtype=torch.float64))
    # mean absolute errors 0.5, 1, 1
    expected = (0.5 / 4 + 1 / 0.5 + 1 / 1) / 3
    assert float(mase(median, target, context, 2)) == pytest.approx(expected)


def test_wql_by_hand():
    target = torch.tensor([[2.0, -2.0]])
    quantiles = torch.tensor([[[1.0, -2.0], [3.0, 0.0]]])  # levels 0.1, 0.9
    # q=0.1: 2*|(2-1)(0-0.1)| + 0 = 0.2; q=0.9: 2*|(2-3)(1-0.9)| + 2*|(-2-0)(1-0.9)| = 0.6
    # sum |y| = 4: (0.2/4 + 0.6/4) / 2
    assert float(wql(quantiles, target, (0.1, 0.9))) == pytest.approx(0.1)


def exact_empirical_crps(samples: np.ndarray, y: float) -> float:
    """Integral of (F(z) - 1{z >= y})^2 dz for the samples' empirical CDF F, piece by piece."""
    points = np.sort(np.append(samples, y))
    total = 0.0
    for left, right in zip(points[:-1], points[1:], strict=True):
        cdf = np.mean(samples <= left)
        step = float(y <= left)
        total += (cdf - step) ** 2 * (right - left)
    return total


def test_crps_is_the_exact_crps_of_the_empirical_distribution():
    g = torch.Generator().manual_seed(1)
    samples = torch.randn(3, 11, 4, generator=g, dtype=torch.float64)
    target = torch.randn(3, 4, generator=g, dtype=torch.float64) + 0.5
    exact = sum(
        exact_empirical_crps(samples[b, :, h].numpy(), float(target[b, h]))
        for b in range(3)
        for h in range(4)
    )
    expected = exact / float(target.abs().sum())
    assert float(crps_from_samples(samples, target)) == pytest.approx(expected, rel=1e-12)


def test_crps_of_a_point_mass_is_the_absolute_error():
    samples = torch.full((1, 4, 2), 3.0)
    target = torch.tensor([[1.0, 2.0]])
    assert float(crps_from_samples(samples, target)) == pytest.approx((2 + 1) / 3)


def with_missing_values(median, quantiles, target, ctx):
    """Some target steps NaN (one window fully) and contexts left-padded with NaN."""
    target, ctx = target.clone(), ctx.clone()
    target[1, 2] = target[4, 0] = NAN
    target[7] = NAN
    ctx[2, :5] = NAN
    ctx[5, :26] = NAN  # 4 observed values: MASE's season (3) still fits
    ctx[9, :28] = NAN  # 2 observed values: falls back to m = 1
    return median, quantiles, target, ctx


@pytest.mark.parametrize("missing", [False, True])
def test_accumulated_metric_equals_functions_on_all_forecasts(missing):
    median, quantiles, target, ctx = random_forecasts()
    if missing:
        median, quantiles, target, ctx = with_missing_values(median, quantiles, target, ctx)
    metric = ForecastMetrics(LEVELS, season_length=3)
    for rows in (slice(0, 2), slice(2, 7), slice(7, 8), slice(8, 12)):
        metric.update(median[rows], quantiles[rows], target[rows], ctx[rows])
    out = metric.compute()
    expected = {
        "nmse": nmse(median, target),
        "mse": mse(median, target),
        "mae": mae(median, target),
        "mase": mase(median, target, ctx, 3),
        "wql": wql(quantiles, target, LEVELS),
    }
    assert out.keys() == expected.keys()
    for name, value in expected.items():
        assert out[name].dtype == torch.float64 and torch.isfinite(out[name])
        torch.testing.assert_close(out[name], value, rtol=1e-12, atol=0, msg=name)


def test_merged_states_equal_one_metric_on_everything():
    median, quantiles, target, ctx = with_missing_values(*random_forecasts(seed=2))
    whole, first, second = (ForecastMetrics(LEVELS, season_length=2) for _ in range(3))
    whole.update(median, quantiles, target, ctx)
    first.update(median[:5], quantiles[:5], target[:5], ctx[:5])
    second.update(median[5:], quantiles[5:], target[5:], ctx[5:])
    first.merge_state(second)
    for name, value in whole.compute().items():
        torch.testing.assert_close(first.compute()[name], value, rtol=1e-12, atol=0)


def test_agrees_with_gluonts_evaluator():
    median, quantiles, target, ctx = random_forecasts(seed=3)
    season = 4
    agg = evaluator_metrics(median, quantiles, target, list(ctx), season)
    assert float(mse(median, target)) == pytest.approx(agg["MSE"], rel=1e-10)
    assert float(mae(median, target)) == pytest.approx(agg["abs_error"] / target.numel())
    assert float(mase(median, target, ctx, season)) == pytest.approx(agg["MASE"], rel=1e-10)
    assert float(wql(quantiles, target, LEVELS)) == pytest.approx(
        agg["mean_wQuantileLoss"], rel=1e-10
    )
    gluonts_nmse = agg["MSE"] / float(target.square().mean())
    assert float(nmse(median, target)) == pytest.approx(gluonts_nmse, rel=1e-10)


def test_agrees_with_gluonts_ev_metrics():
    median, quantiles, target, ctx = random_forecasts(seed=4)
    season = 5
    data = {
        "label": np.ma.masked_invalid(target.numpy()),
        "seasonal_error": np.stack([seasonal_error(c, season, time_axis=-1) for c in ctx.numpy()]),
        **{str(q): quantiles[:, i].numpy() for i, q in enumerate(LEVELS)},
        "mean": median.numpy(),
    }
    reference = {
        "mase": MASE()(axis=None),
        "wql": MeanWeightedSumQuantileLoss(quantile_levels=LEVELS)(axis=None),
        "mse": MSE(forecast_type="0.5")(axis=None),
    }
    for metric in reference.values():
        metric.update(data)
    assert float(mase(median, target, ctx, season)) == pytest.approx(
        float(reference["mase"].get()), rel=1e-10
    )
    assert float(wql(quantiles, target, LEVELS)) == pytest.approx(
        float(reference["wql"].get()), rel=1e-10
    )
    assert float(mse(median, target)) == pytest.approx(float(reference["mse"].get()), rel=1e-10)


def test_missing_values_agree_with_gluonts_evaluator_on_the_unpadded_histories():
    median, quantiles, target, ctx = with_missing_values(*random_forecasts(seed=5))
    histories = [c[~c.isnan()] for c in ctx]  # gluonts sees each window's real history
    agg = evaluator_metrics(median, quantiles, target, histories, 3)
    assert float(mase(median, target, ctx, 3)) == pytest.approx(agg["MASE"], rel=1e-10)
    assert float(wql(quantiles, target, LEVELS)) == pytest.approx(
        agg["mean_wQuantileLoss"], rel=1e-10
    )
    observed = ~target.isnan()
    errors = (median - target)[observed]
    assert float(mse(median, target)) == pytest.approx(float(errors.square().mean()))
    assert float(mae(median, target)) == pytest.approx(float(errors.abs().mean()))
    y = target[observed]
    assert float(nmse(median, target)) == pytest.approx(
        float(errors.square().sum() / y.square().sum())
    )


def test_windows_with_a_constant_context_are_left_out_of_mase_as_gluonts_aggregate_valid():
    median, quantiles, target, ctx = random_forecasts(seed=6)
    ctx = ctx.clone()
    ctx[3] = 2.0  # scale 0: gluonts' MASE is inf, which aggregate_valid leaves out
    ctx[8] = 1.5
    agg = evaluator_metrics(
        median, quantiles, target, list(ctx), 2, aggregation_strategy=aggregate_valid
    )
    assert float(mase(median, target, ctx, 2)) == pytest.approx(agg["MASE"], rel=1e-10)
    metric = ForecastMetrics(LEVELS, season_length=2)
    metric.update(median, quantiles, target, ctx)
    assert float(metric.compute()["mase"]) == pytest.approx(agg["MASE"], rel=1e-10)


def test_a_nan_forecast_makes_the_metrics_nan():
    median, quantiles, target, ctx = random_forecasts(seed=7)
    median, quantiles = median.clone(), quantiles.clone()
    median[0, 0] = NAN
    quantiles[0, 0, 0] = NAN
    assert nmse(median, target).isnan() and mase(median, target, ctx, 1).isnan()
    assert wql(quantiles, target, LEVELS).isnan()


def test_bad_shapes_and_arguments_name_the_problem():
    median, quantiles, target, ctx = random_forecasts(batch=3)
    with pytest.raises(ValueError, match="median forecast shape"):
        nmse(median[:, :3], target)
    with pytest.raises(ValueError, match=r"quantile forecasts must be \[windows, levels, horizon"):
        wql(quantiles[:, :4], target, LEVELS)
    with pytest.raises(ValueError, match="context must be"):
        mase(median, target, ctx[:2], 1)
    with pytest.raises(ValueError, match="season_length must be a positive integer"):
        ForecastMetrics(LEVELS, season_length=0)
    with pytest.raises(ValueError, match="quantile_levels"):
        ForecastMetrics((0.5, 1.0))
    metric = ForecastMetrics(LEVELS)
    with pytest.raises(ValueError, match="quantile forecasts"):
        metric.update(median, quantiles[:, :4], target, ctx)
    assert int(metric.observed) == 0  # a rejected batch changes no state


def _ddp_rank(rank: int, world: int, port: int, parts: list, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    metric = ForecastMetrics(LEVELS, season_length=3)
    for batch in parts[rank]:
        metric.update(*batch)
    values = metric.compute()  # synchronises the sums over the ranks
    if rank == 0:
        out.update({name: float(value) for name, value in values.items()})
    dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process():
    forecasts = with_missing_values(*random_forecasts(seed=8))
    batches = [tuple(x[rows] for x in forecasts) for rows in (slice(0, 5), slice(5, 12))]
    single = ForecastMetrics(LEVELS, season_length=3)
    for batch in batches:
        single.update(*batch)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_ddp_rank, args=(2, port, [[batches[0]], [batches[1]]], out), nprocs=2)
        ddp = dict(out)
    for name, value in single.compute().items():
        assert ddp[name] == pytest.approx(float(value), rel=1e-12), name
