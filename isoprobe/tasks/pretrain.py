"""``task=pretrain``: train from scratch as ``task=finetune`` does, then export the weights in
the format ``model.checkpoint=<export_dir>`` loads, with how they were made."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
from omegaconf import DictConfig, OmegaConf

from isoprobe.models.adaptation import merged_export
from isoprobe.models.base import ForecastModule
from isoprobe.models.compression_files import export_compressed
from isoprobe.tasks.finetune import run_finetune
from isoprobe.tasks.task import Task


def run_pretrain(
    cfg: DictConfig, trainer: L.Trainer, model: ForecastModule, datamodule
) -> dict[str, Any]:
    results = run_finetune(cfg, trainer, model, datamodule)
    return {**results, "export_dir": export(cfg, trainer, model)}


def export(cfg: DictConfig, trainer: L.Trainer, model: ForecastModule) -> str:
    """Write the pretrained weights and how they were made (command, steps, losses)."""
    export_dir = Path(cfg.task.export_dir)
    if trainer.is_global_zero:
        dtype = cfg.task.get("export_dtype", "float32")
        if model.compression:
            export_compressed(model, model.compression, str(export_dir), dtype)
        else:
            merged_export(model, str(export_dir), dtype)
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        provenance = {
            "command": "python run.py " + " ".join(sys.argv[1:]),
            "global_steps": trainer.global_step,
            "epochs": trainer.current_epoch,
            "final_metrics": metrics,
            "data": OmegaConf.to_container(cfg.data, resolve=True),
        }
        (export_dir / "provenance.json").write_text(json.dumps(provenance, indent=2))
    return str(export_dir)


PRETRAIN = Task("pretrain", trains=True, run=run_pretrain)
