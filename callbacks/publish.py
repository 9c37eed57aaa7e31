"""Send one probed epoch to the trainer's loggers (call on global rank zero only).

Every logger gets ``probe/<metric>/<layer>`` and ``probe/epoch``; W&B additionally gets
``probe/*`` plotted against ``probe/epoch`` (``define_metric``), a table of the epoch's rows
and 3-D PCA point clouds coloured by cluster.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.loggers import Logger, WandbLogger

TABLE_COLUMNS = ["epoch", "layer", "metric", "value"]
#: the longest transaction-log flush interval that a probe waits for (see wait_until_written)
MAX_FLUSH_WAIT_SECONDS = 1.0


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
            wait_until_written(logger.experiment)
        else:
            logger.log_metrics(dict(metrics), step=step)


def wait_until_written(run: Any) -> None:
    """Return once wandb's service has written what ``run`` logged so far to the run's local
    transaction log, so that the checkpoint saved after a probe never holds an epoch that a
    killed process lost from W&B. Reading the summary is a round trip through the service,
    which handles records in order; its writer then flushes within
    ``x_transaction_log_flush_interval`` (0.25 s in configs/logger/wandb.yaml). With wandb's
    default of 15 s, waiting would cost more than it saves, and nothing is waited for."""
    interval = float(run.settings.x_transaction_log_flush_interval)
    if 0 < interval <= MAX_FLUSH_WAIT_SECONDS:
        dict(run.summary)
        time.sleep(2 * interval)


def log_trajectory_image(loggers: Sequence[Logger], path: Path) -> None:
    """The end-of-fit trajectory PNG as a W&B image (other loggers have the file)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            logger.experiment.log({"probe/trajectories": wandb.Image(str(path))})
