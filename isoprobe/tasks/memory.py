"""Refuse a training run whose estimated peak memory exceeds what the device has free."""

from __future__ import annotations

import lightning as L
import psutil
import torch

from isoprobe.models.base import ForecastModule

GIB = 2**30


def check_training_fits(model: ForecastModule, batch_size: int, trainer: L.Trainer) -> None:
    """Raise ``MemoryError`` before training when one step on ``batch_size`` windows needs more
    than the free GPU memory, or more than this process's share of the available RAM."""
    need = model.training_memory_bytes(batch_size)
    device = trainer.strategy.root_device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        where = f"{device} has {free / GIB:.1f} GiB free"
    else:
        processes = max(1, trainer.num_devices)
        free = psutil.virtual_memory().available // processes
        where = f"the machine has {free / GIB:.1f} GiB available per training process"
    if need > free:
        raise MemoryError(
            f"one training step needs about {need / GIB:.1f} GiB (batch {batch_size}, context "
            f"{model.context_length}, horizon {model.prediction_length}), but {where}. Lower "
            "data.batch_size or data.context_length."
        )
