"""``task=finetune``: forecast the test split, train (probing every epoch), forecast again."""

from __future__ import annotations

from typing import Any

import lightning as L
from omegaconf import DictConfig

from isoprobe.models.adaptation import frozen_modules_expected
from isoprobe.models.base import ForecastModule
from isoprobe.tasks.resume import RunIdentity
from isoprobe.tasks.task import Task


def run_finetune(
    cfg: DictConfig, trainer: L.Trainer, model: ForecastModule, datamodule
) -> dict[str, Any]:
    """The test forecast before training (``task.evaluate_before``; a resumed run reports its
    first part's), the training, and the test forecast after it (``task.evaluate_after``)."""
    results: dict[str, Any] = {}
    ckpt_path = cfg.get("ckpt_path")
    if cfg.task.evaluate_before:
        # a resumed run has no untrained model: its start's forecast is the first part's
        (run_identity,) = [c for c in trainer.callbacks if isinstance(c, RunIdentity)]
        if ckpt_path is None:
            run_identity.before = trainer.test(model, datamodule=datamodule, verbose=False)[0]
        if run_identity.before is not None:
            results["before"] = run_identity.before
    with frozen_modules_expected(model):
        trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    if model.compile_seconds is not None:
        results["compile_seconds"] = model.compile_seconds
    if cfg.task.evaluate_after:
        results["after"] = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    return results


FINETUNE = Task("finetune", trains=True, run=run_finetune)
