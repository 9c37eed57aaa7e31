"""Moirai 2.0's official forecast: uni2ts 2.0.0's ``Moirai2Forecast.forward`` (its roll-out past
one call, a path per quantile level) on ``Moirai2Module.from_pretrained`` of the checkpoint
directory (config.json as the module's arguments, model.safetensors strictly by name), at the
task's context and horizon; the values with 0 at missing steps, their observed mask and the
left padding, as tests/fixtures/moirai2/make_fixture.py hands them. Its quantiles are the
module's own levels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from uni2ts.model.moirai2 import Moirai2Forecast, Moirai2Module


def load(checkpoint: Path, task: dict):
    module = Moirai2Module.from_pretrained(str(checkpoint))
    if not np.allclose(module.quantile_levels, task["levels"]):
        raise ValueError(f"the checkpoint's levels {module.quantile_levels} are not the bench's")
    forecaster = Moirai2Forecast(
        prediction_length=int(task["prediction_length"]),
        target_dim=1,
        feat_dynamic_real_dim=0,
        past_feat_dynamic_real_dim=0,
        context_length=task["context"].shape[1],
        module=module,
    ).eval()

    def predict(context: np.ndarray) -> np.ndarray:
        missing = np.isnan(context)
        return forecaster(
            past_target=torch.from_numpy(np.nan_to_num(context, nan=0.0))[..., None],
            past_observed_target=torch.from_numpy(~missing)[..., None],
            past_is_pad=torch.from_numpy(np.cumprod(missing, axis=1).astype(bool)),
        ).numpy()

    return predict
