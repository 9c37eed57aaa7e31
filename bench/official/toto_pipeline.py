"""Toto's official forecast: the ``toto-ts`` package 0.2.0's ``TotoForecaster.forecast`` on
``Toto.load_from_checkpoint`` of the checkpoint directory (config.json + model.safetensors,
strict), with the task's sample count drawn in one batch (``samples_per_batch`` = the samples,
as isoprobe draws them; the package's default, 10, splits them into batches) and its default KV
cache; the quantiles are ``torch.quantile`` of the sample paths. Missing steps (a left padding
only, here) read as the package's padding: value 0, padding mask false.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from toto.data.util.dataset import MaskedTimeseries
from toto.inference.forecaster import TotoForecaster
from toto.model.toto import Toto


def load(checkpoint: Path, task: dict):
    model = Toto.load_from_checkpoint(str(checkpoint), strict=True).eval()
    forecaster = TotoForecaster(model.model)
    horizon, samples = int(task["prediction_length"]), int(task["num_samples"])
    levels = torch.tensor(task["levels"], dtype=torch.float32)

    def predict(context: np.ndarray) -> np.ndarray:
        series = torch.from_numpy(np.nan_to_num(context, nan=0.0))[:, None]
        inputs = MaskedTimeseries(
            series=series,
            padding_mask=torch.from_numpy(np.isfinite(context))[:, None],
            id_mask=torch.zeros_like(series, dtype=torch.int),
            timestamp_seconds=torch.zeros_like(series, dtype=torch.int),
            time_interval_seconds=torch.ones(len(context), 1, dtype=torch.int),
        )
        forecast = forecaster.forecast(
            inputs, horizon, num_samples=samples, samples_per_batch=samples
        )
        paths = forecast.samples[:, 0]  # [B, H, S]
        return torch.quantile(paths, levels, dim=-1).permute(1, 0, 2).numpy()

    return predict
