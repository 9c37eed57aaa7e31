"""``task=probe``: probe the model as loaded (zero-shot) once, and forecast the test split."""

from __future__ import annotations

from typing import Any

import lightning as L
from omegaconf import DictConfig

from isoprobe.models.base import ForecastModule
from isoprobe.tasks.task import Task


def run_probe(
    cfg: DictConfig, trainer: L.Trainer, model: ForecastModule, datamodule
) -> dict[str, Any]:
    """One validation pass, which feeds the probes, and the test forecast
    (``task.evaluate_before``; ``task.evaluate_after`` forecasts the same weights again). With
    ``ckpt_path`` the saved weights are probed and forecast, not the model config's."""
    ckpt_path = cfg.get("ckpt_path")
    # the validation pass only feeds the probes (the forecast is the test split's), so it skips
    # forecasting, which for a sampling model costs more than the probes
    model.forecast_on_validation = False
    trainer.validate(
        model, datamodule=datamodule, verbose=False, ckpt_path=ckpt_path, weights_only=True
    )
    results: dict[str, Any] = {}
    if cfg.task.evaluate_before:
        results["before"] = trainer.test(
            model, datamodule=datamodule, verbose=False, ckpt_path=ckpt_path, weights_only=True
        )[0]
    if cfg.task.evaluate_after:
        results["after"] = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    return results


PROBE = Task("probe", trains=False, run=run_probe)
