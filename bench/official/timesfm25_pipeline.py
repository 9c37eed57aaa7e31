"""TimesFM 2.5's official forecast: the ``timesfm`` package 3.0.2's PyTorch model
(``TimesFM_2p5_200M_torch``), its ``forecast`` after ``compile`` with the ``ForecastConfig``
defaults (flip invariance, the clip at 0 of non-negative windows, no continuous quantile head),
the context and horizon of the task and one batch of all windows (``per_core_batch_size``; the
default, 1, would forecast one window at a time). No torch.compile.

The package builds its architecture from a class attribute (the published 200M definition):
the checkpoint's config.json (an isoprobe export's, the shape of the weights) sizes it here, as
tests/fixtures/timesfm25/make_fixture.py does; the weights load with the package's own
``load_checkpoint`` (strict).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from timesfm import configs
from timesfm.timesfm_2p5 import timesfm_2p5_base, timesfm_2p5_torch


def definition(config: dict) -> timesfm_2p5_base.TimesFM_2p5_200M_Definition:
    """The published definition at the sizes of an isoprobe config.json."""
    published = timesfm_2p5_base.TimesFM_2p5_200M_Definition()
    width, outputs = config["model_dims"], len(config["quantiles"]) + 1
    return dataclasses.replace(
        published,
        input_patch_len=config["input_patch_len"],
        output_patch_len=config["output_patch_len"],
        output_quantile_len=config["output_quantile_len"],
        decode_index=config["decode_index"],
        quantiles=list(config["quantiles"]),
        tokenizer=dataclasses.replace(
            published.tokenizer,
            input_dims=2 * config["input_patch_len"],
            hidden_dims=width,
            output_dims=width,
        ),
        stacked_transformers=configs.StackedTransformersConfig(
            num_layers=config["num_layers"],
            transformer=dataclasses.replace(
                published.stacked_transformers.transformer,
                model_dims=width,
                hidden_dims=config["hidden_dims"],
                num_heads=config["num_heads"],
            ),
        ),
        output_projection_point=dataclasses.replace(
            published.output_projection_point,
            input_dims=width,
            hidden_dims=width,
            output_dims=config["output_patch_len"] * outputs,
        ),
        output_projection_quantiles=dataclasses.replace(
            published.output_projection_quantiles,
            input_dims=width,
            hidden_dims=width,
            output_dims=config["output_quantile_len"] * outputs,
        ),
    )


def load(checkpoint: Path, task: dict):
    config = json.loads((checkpoint / "config.json").read_text())
    if not np.allclose(config["quantiles"], task["levels"]):
        raise ValueError(f"the checkpoint's quantiles {config['quantiles']} are not the bench's")
    timesfm_2p5_torch.TimesFM_2p5_200M_torch_module.config = definition(config)
    model = timesfm_2p5_torch.TimesFM_2p5_200M_torch(torch_compile=False)
    model.load_checkpoint(str(checkpoint), torch_compile=False)
    model.model.eval()
    batch, length = task["context"].shape
    horizon = int(task["prediction_length"])
    model.compile(
        configs.ForecastConfig(max_context=length, max_horizon=horizon, per_core_batch_size=batch)
    )

    def predict(context: np.ndarray) -> np.ndarray:
        _, channels = model.forecast(horizon, list(context.astype(np.float64)))
        return channels[..., 1:].transpose(0, 2, 1)  # [B, H, mean + levels] -> [B, levels, H]

    return predict
