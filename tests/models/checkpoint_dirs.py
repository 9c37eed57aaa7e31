"""Checkpoint directories for the loading tests of models published as config.json beside
model.safetensors (Sundial, Toto, Moirai 2.0, Time-MoE, TimesFM 2.5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


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
