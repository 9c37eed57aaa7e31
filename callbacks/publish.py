"""Send one probed epoch to the trainer's loggers (call on global rank zero only).

Every logger gets ``probe/<metric>/<layer>`` and ``probe/epoch``; W&B additionally gets
``probe/*`` plotted against ``probe/epoch`` (``define_metric``), a table of the epoch's rows
and 3-D PCA point clouds coloured by cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.loggers import Logger, WandbLogger

TABLE_COLUMNS = ["epoch", "layer", "metric", "value"]


@dataclass(frozen=True)
class PointCloud:
    """A layer's tokens on their first three principal axes with an RGB colour per cluster."""

    coords: np.ndarray  # [N, 3]
    colours: np.ndarray  # [N, 3] uint8
    num_clusters: int


def scalar_metrics(epoch: int, records: Sequence[Mapping[str, Any]], seconds: float) -> dict:
    """``probe/<metric>/<layer>`` for every measured value, ``probe/epoch`` and
    ``probe/seconds`` (the probe's wall time). Failed layers (metric ``error``) are left out."""
    metrics: dict[str, float] = {
        f"probe/{r['metric']}/{r['layer']}": r["value"] for r in records if r["metric"] != "error"
    }
    metrics["probe/epoch"] = epoch
    metrics["probe/seconds"] = seconds
    return metrics


def define_wandb_axes(logger: WandbLogger) -> None:
    """Plot every ``probe/*`` key against ``probe/epoch`` instead of the global step."""
    run = logger.experiment
    run.define_metric("probe/epoch")
    run.define_metric("probe/*", step_metric="probe/epoch")


def wandb_media(
    epoch: int,
    records: Sequence[Mapping[str, Any]],
    clouds: Mapping[str, PointCloud],
    with_table: bool,
) -> dict[str, Any]:
    import wandb

    media: dict[str, Any] = {}
    if with_table:
        rows = [[epoch, r["layer"], r["metric"], r["value"]] for r in records]
        media["probe/table"] = wandb.Table(columns=TABLE_COLUMNS, data=rows)
    for layer, cloud in clouds.items():
        points = np.hstack([cloud.coords, cloud.colours.astype(np.float64)])
        media[f"probe/pca/{layer}"] = wandb.Object3D(points)
    return media


def log_epoch(
    loggers: Sequence[Logger],
    step: int,
    metrics: Mapping[str, float],
    media: Mapping[str, Any] | None,
    wandb_defined: set[int],
) -> None:
    """One call per logger; W&B gets scalars and media in one history row. ``wandb_defined``
    holds the ids of W&B runs already given their axes."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            if id(logger.experiment) not in wandb_defined:
                define_wandb_axes(logger)
                wandb_defined.add(id(logger.experiment))
            logger.log_metrics({**metrics, **(media or {})}, step=step)
        else:
            logger.log_metrics(dict(metrics), step=step)


def log_trajectory_image(loggers: Sequence[Logger], path: Path) -> None:
    """The end-of-fit trajectory PNG as a W&B image (other loggers have the file)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            logger.experiment.log({"probe/trajectories": wandb.Image(str(path))})
