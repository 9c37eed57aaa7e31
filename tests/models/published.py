"""What the tests of the models published as config.json beside model.safetensors (Sundial,
Toto, Moirai 2.0, Time-MoE, TimesFM 2.5, TiRex) share: the model built from a checkpoint for
given windows, a copy of a checkpoint to edit, and the largest difference from the official
code's output."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from isoprobe.tasks.runner import build_model
from tests.conftest import compose_config


def built_model(tmp_path, model: str, checkpoint: str, context: int, horizon: int, overrides=()):
    """``model=<model>`` loaded from ``checkpoint`` for windows of ``context`` / ``horizon``
    steps (hourly, no season), in evaluation mode."""
    cfg = compose_config(tmp_path, [f"model={model}", f"model.checkpoint={checkpoint}", *overrides])
    windows = SimpleNamespace(
        context_length=context, prediction_length=horizon, season_length=1, freq="h"
    )
    return build_model(cfg.model, windows).eval()


def largest_difference(got: torch.Tensor, expected: np.ndarray, name: str) -> float:
    """max |isoprobe - official| in float64, printed (``pytest -s`` shows the docs' parity
    figures)."""
    assert tuple(got.shape) == expected.shape, name
    difference = float((got.double() - torch.from_numpy(expected).double()).abs().max())
    print(f"parity {name}: {difference:.1e}")
    return difference


def copied_checkpoint(source: Path, tmp_path: Path, **config_changes: Any) -> Path:
    """``source``'s config.json and model.safetensors copied into ``tmp_path / "checkpoint"``,
    with ``config_changes`` written over the config's keys."""
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(source / name, directory / name)
    if config_changes:
        config = json.loads((directory / "config.json").read_text())
        config.update(config_changes)
        (directory / "config.json").write_text(json.dumps(config))
    return directory
