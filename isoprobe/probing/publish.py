"""Send one probed epoch to the trainer's loggers (call on global rank zero only).

Every logger gets ``<prefix>/<metric>/<layer>``, ``<prefix>/epoch``, ``<prefix>/step`` and
``<prefix>/seconds``
(``prefix`` is the probe's ``log_prefix``: ``probe`` for the isotropy probe, ``rank`` for the
rank probe); W&B additionally gets ``<prefix>/*`` plotted against ``<prefix>/step``
(``define_metric``), a table of the epoch's rows and the media the probe adds (point clouds,
spectra, plots).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.loggers import Logger, WandbLogger

from isoprobe.probing.schedule import ProbeTime

log = logging.getLogger(__name__)

TABLE_COLUMNS = ["epoch", "layer", "metric", "value"]
#: the longest transaction-log flush interval that a probe waits for (see wait_until_written)
MAX_FLUSH_WAIT_SECONDS = 1.0


@dataclass(frozen=True)
class PointCloud:
    """A layer's tokens on their first three principal axes with an RGB colour per cluster."""

    coords: np.ndarray  # [N, 3]
    colours: np.ndarray  # [N, 3] uint8
    num_clusters: int


def scalar_metrics(
    prefix: str, when: ProbeTime, records: Sequence[Mapping[str, Any]], seconds: float
) -> dict[str, float]:
    """``<prefix>/<metric>/<layer>`` for every measured value, ``<prefix>/epoch``,
    ``<prefix>/step`` and ``<prefix>/seconds`` (the probe's wall time). Failed layers (metric
    ``error``) are left out."""
    metrics: dict[str, float] = {
        f"{prefix}/{r['metric']}/{r['layer']}": r["value"]
        for r in records
        if r["metric"] != "error"
    }
    metrics[f"{prefix}/epoch"] = when.epoch
    metrics[f"{prefix}/step"] = when.step
    metrics[f"{prefix}/seconds"] = seconds
    return metrics


def define_wandb_axes(logger: WandbLogger, prefix: str) -> None:
    """Plot every ``<prefix>/*`` key against ``<prefix>/step``, the probe's optimizer step."""
    run = logger.experiment
    run.define_metric(f"{prefix}/step")
    run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")


def records_table(epoch: int, records: Sequence[Mapping[str, Any]]) -> Any:
    """A W&B table of one epoch's (epoch, layer, metric, value) rows."""
    import wandb

    rows = [[epoch, r["layer"], r["metric"], r["value"]] for r in records]
    return wandb.Table(columns=TABLE_COLUMNS, data=rows)


def point_clouds(prefix: str, clouds: Mapping[str, PointCloud]) -> dict[str, Any]:
    """``<prefix>/pca/<layer>``: W&B 3-D point clouds (x, y, z, r, g, b per point)."""
    import wandb

    return {
        f"{prefix}/pca/{layer}": wandb.Object3D(
            np.hstack([cloud.coords, cloud.colours.astype(np.float64)])
        )
        for layer, cloud in clouds.items()
    }


def log_probe(
    loggers: Sequence[Logger],
    when: ProbeTime,
    prefix: str,
    metrics: Mapping[str, float],
    media: Mapping[str, Any] | None,
    wandb_defined: set[int],
) -> None:
    """One call per logger; W&B gets scalars and media in one history row. ``wandb_defined``
    holds the ids of W&B runs already given the ``prefix`` axes. A W&B run that already holds
    the probe (a resumed run whose earlier part logged it before stopping) is not given it
    again."""
    step = when.step
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            if wandb_holds_probe(logger.experiment, prefix, when):
                continue
            if id(logger.experiment) not in wandb_defined:
                define_wandb_axes(logger, prefix)
                wandb_defined.add(id(logger.experiment))
            logger.log_metrics({**metrics, **(media or {})}, step=step)
            wait_until_written(logger.experiment)
        else:
            logger.log_metrics(dict(metrics), step=step)


def wandb_holds_probe(run: Any, prefix: str, when: ProbeTime) -> bool:
    """Whether the W&B ``run`` already holds the probe ``when`` of ``prefix``: its summary's
    ``<prefix>/step`` (``<prefix>/epoch`` for a run logged before probes had a step key), the
    last one published (online, from the server; offline, restored from the earlier parts' logs
    by :func:`isoprobe.tasks.loggers.continue_wandb_run`), is at or after it. Probe times only
    increase within a run, so every earlier one is held."""
    key, at = f"{prefix}/step", when.step
    if run.summary.get(key) is None:
        key, at = f"{prefix}/epoch", when.epoch
    held = run.summary.get(key)
    if held is None or at > held:
        return False
    log.warning(
        "W&B run %s already holds %s %d (up to %d, logged before the run was resumed); not "
        "logging it again (it is in the CSV)",
        run.id,
        key,
        at,
        held,
    )
    return True


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


def log_image(loggers: Sequence[Logger], key: str, path: Path) -> None:
    """A PNG as a W&B image under ``key`` (other loggers have the file)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            import wandb

            logger.experiment.log({key: wandb.Image(str(path))})
