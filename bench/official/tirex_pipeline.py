"""TiRex's official forecast: the ``tirex-ts`` package 1.4.2's ``TiRexZero`` on its pure-torch
sLSTM path (``backend="torch"``, as the package runs its cells in bfloat16), its ``forecast``
(quantiles at the model's levels) of all windows as one batch.

The package's loader reads only its own format, a Lightning ``model.ckpt`` (``hyper_parameters``
and ``state_dict``, through ``torch.load(weights_only=True)``); an isoprobe checkpoint is
config.json and model.safetensors under the published tensor names. So the weights are
converted here, in the side process: the safetensors' tensors and the config's shape are written
as such a checkpoint (tensors and plain containers only) to a temporary file, which the
package's own ``TiRexZero.from_pretrained`` then loads.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from tirex.models.tirex import TiRexZero


def lightning_checkpoint(checkpoint: Path) -> dict:
    """The package's checkpoint layout of an isoprobe config.json + model.safetensors."""
    config = json.loads((checkpoint / "config.json").read_text())
    model_config = {
        "input_patch_size": config["input_patch_size"],
        "output_patch_size": config["output_patch_size"],
        "quantiles": list(config["quantiles"]),
        "block_kwargs": {
            "embedding_dim": config["embedding_dim"],
            "num_heads": config["num_heads"],
            "num_blocks": config["num_blocks"],
            "ffn_proj_factor": config["ffn_proj_factor"],
        },
        "input_ff_dim": config["input_ff_dim"],
    }
    shape = {"model_config": model_config, "train_ctx_len": config["train_ctx_len"]}
    return {
        "hyper_parameters": shape,
        "state_dict": load_file(checkpoint / "model.safetensors"),
    }


def load(checkpoint: Path, task: dict):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.ckpt"
        torch.save(lightning_checkpoint(checkpoint), path)
        model = TiRexZero.from_pretrained(str(path), backend="torch", device="cpu").eval()
    if not np.allclose(model.config.quantiles, task["levels"]):
        raise ValueError(f"the checkpoint's levels {model.config.quantiles} are not the bench's")
    horizon = int(task["prediction_length"])

    def predict(context: np.ndarray) -> np.ndarray:
        quantiles, _ = model.forecast(
            torch.from_numpy(context), prediction_length=horizon, batch_size=len(context)
        )
        return quantiles.numpy().transpose(0, 2, 1)  # [B, H, levels] -> [B, levels, H]

    return predict
