"""Refuse a run whose estimated peak memory exceeds what the device has free."""

from __future__ import annotations

import lightning as L
import psutil
import torch

from isoprobe.models.base import ForecastModule

GIB = 2**30


def check_memory_fits(
    model: ForecastModule, datamodule: L.LightningDataModule, trainer: L.Trainer, training: bool
) -> None:
    """Raise ``MemoryError`` before anything runs when a training step (``training``) or a
    forecast of one evaluation batch needs more than the free GPU memory, or more than this
    process's share of the available RAM."""
    needs = {
        "forecasting one evaluation batch": model.forecast_memory_bytes(datamodule.eval_batch_size)
    }
    if training:
        needs["one training step"] = model.training_memory_bytes(datamodule.batch_size)
    device = trainer.strategy.root_device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        where = f"{device} has {free / GIB:.1f} GiB free"
    else:
        free = psutil.virtual_memory().available // max(1, trainer.num_devices)
        where = f"the machine has {free / GIB:.1f} GiB available per process"
    for what, need in needs.items():
        if need > free:
            raise MemoryError(
                f"{what} needs about {need / GIB:.1f} GiB (batch {datamodule.batch_size}, "
                f"evaluation batch {datamodule.eval_batch_size}, context {model.context_length}, "
                f"horizon {model.prediction_length}), but {where}. Lower data.batch_size / "
                "data.eval_batch_size or data.context_length."
            )
