"""Experiment loggers from the ``logger`` config group, W&B offline when no key is set."""

from __future__ import annotations

import csv
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import wandb
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import Callback
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, open_dict
from wandb.errors import AuthenticationError
from wandb.proto import wandb_internal_pb2
from wandb.sdk.lib.runid import generate_id
from wandb.sdk.lib.wbauth.wbnetrc import read_netrc_auth

log = logging.getLogger(__name__)


def wandb_goes_offline() -> bool:
    """Whether W&B must log offline: wandb's own settings (``WANDB_MODE``, ``WANDB_BASE_URL``,
    settings files) say so, or no API key is configured for the server they name.

    The key is looked for where ``wandb login`` leaves it: ``WANDB_API_KEY`` or the settings,
    else wandb's own reading of the netrc file (``NETRC`` overrides ~/.netrc) for the server
    of ``base_url``, so a self-hosted server is logged to online as soon as its key is there.
    """
    settings = wandb.setup().settings
    if settings.mode in ("offline", "dryrun", "disabled"):
        return True
    if settings.api_key:
        return False
    try:
        return read_netrc_auth(host=settings.base_url) is None
    except AuthenticationError as err:
        log.warning("W&B: the netrc key for %s is not usable (%s).", settings.base_url, err)
        return True


class _AppendingWriter(ExperimentWriter):
    """Lightning's CSV writer, except that an existing ``metrics.csv`` (a run resumed in place)
    is continued: its header is taken over and new rows are appended, where Lightning's writer
    deletes the file."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])


class AppendingCSVLogger(CSVLogger):
    """``logger=csv``: Lightning's CSVLogger that keeps the rows already in ``metrics.csv``."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


class LoggersSavedWithCheckpoint(Callback):
    """Writes out what the loggers hold before each checkpoint file is written.

    Lightning saves a checkpoint before the CSV logger writes the epoch's buffered rows, so a
    run killed between the two resumes from that checkpoint with those rows lost for good (the
    resumed run starts after them). ``on_save_checkpoint`` runs before the file is written."""

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        for logger in trainer.loggers:
            logger.save()


def sweep_group() -> str | None:
    """The W&B group of this run when none is set: in a multirun, its sweep directory's name (the
    group of the sweep's analysis too, :mod:`isoprobe.tasks.sweep_analysis`), so that a study's
    runs are one group; None (no group) for a single run."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(str(HydraConfig.get().sweep.dir)).name


def build_loggers(logger_cfg: DictConfig | None, resume_ids: dict[str, Any]) -> dict[str, Logger]:
    """Config name -> logger; W&B goes offline without a key, resumes ``resume_ids``, and groups
    a sweep's runs (:func:`sweep_group`) unless ``group`` is set."""
    loggers: dict[str, Logger] = {}
    for name, cfg in (logger_cfg or {}).items():
        if not cfg or "_target_" not in cfg:
            continue
        if cfg._target_.endswith("WandbLogger"):
            with open_dict(cfg):
                if not cfg.get("offline") and wandb_goes_offline():
                    log.warning(
                        "W&B: offline (WANDB_MODE, or no API key for %s), logging to %s; "
                        "upload later with `wandb sync`.",
                        wandb.setup().settings.base_url,
                        cfg.save_dir,
                    )
                    cfg.offline = True
                if cfg.get("offline"):
                    # wandb.init's own flag: the WANDB_MODE that Lightning's offline sets comes
                    # too late once wandb has read its settings (wandb_goes_offline did), and
                    # wandb would then ask for a key and stop the run
                    cfg.mode = "offline"
                if resume_ids.get(name):
                    cfg.id = resume_ids[name]
                    cfg.resume = "allow"
                elif not cfg.get("id"):
                    # fixed now, not when the run starts, so that checkpoints can store it
                    cfg.id = generate_id()
                if not cfg.get("group"):
                    cfg.group = sweep_group()
        loggers[name] = instantiate(cfg, _convert_="all")
    return loggers


def wandb_run_ids(loggers: dict[str, Logger]) -> dict[str, Any]:
    """Config name -> run id of each W&B logger, stored in checkpoints to resume the same run."""
    return {name: lg.version for name, lg in loggers.items() if isinstance(lg, WandbLogger)}


def wandb_save_dirs(
    loggers: dict[str, Logger], earlier: dict[str, list[str]]
) -> dict[str, list[str]]:
    """Config name -> the ``save_dir`` of every part of each W&B run so far (``earlier``, from
    the checkpoint resumed, then this part's), stored in checkpoints so that a resumed part finds
    what the parts before it logged."""
    dirs = {}
    for name, lg in loggers.items():
        if isinstance(lg, WandbLogger):
            here = str(Path(lg.save_dir or ".").resolve())
            dirs[name] = list(dict.fromkeys([*earlier.get(name, []), here]))
    return dirs


#: the local log of one W&B run part: ``<save_dir>/wandb/[offline-]run-<time>-<id>/run-<id>.wandb``
_BLOCK = 32768  # wandb's transaction log: a 7-byte file header, then LevelDB-log records
_HEADER = 7


def _log_payloads(data: bytes) -> Iterator[bytes]:
    """The records of a W&B transaction log, up to the first incomplete one (a killed writer)."""
    position, pending = _HEADER, b""
    while position + _HEADER <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _HEADER:  # the rest of a block too short for a record header is padding
            position += left
            continue
        length = int.from_bytes(data[position + 4 : position + 6], "little")
        kind = data[position + 6]
        payload = data[position + _HEADER : position + _HEADER + length]
        position += _HEADER + length
        if len(payload) < length:
            return
        if kind == 1:  # full
            yield payload
        elif kind == 2:  # first
            pending = payload
        elif kind == 3:  # middle
            pending += payload
        elif kind == 4:  # last
            yield pending + payload


@dataclass
class WandbHistory:
    """What the earlier parts of a W&B run logged: the last history step and, per key
    ``<prefix>/epoch``, the last epoch a probe published."""

    last_step: int = -1
    last_epochs: dict[str, int] = field(default_factory=dict)

    def add_row(self, row: dict[str, Any]) -> None:
        self.last_step = max(self.last_step, int(row.get("_step", -1)))
        for key, value in row.items():
            if key.endswith("/epoch") and isinstance(value, (int, float)):
                self.last_epochs[key] = max(self.last_epochs.get(key, int(value)), int(value))


def read_wandb_history(save_dirs: Iterable[str | Path], run_id: str) -> WandbHistory:
    """The history that the local parts of W&B run ``run_id`` under ``save_dirs`` hold (what
    an offline part logged is known nowhere else)."""
    history = WandbHistory()
    for save_dir in dict.fromkeys(Path(d) for d in save_dirs):
        for log_file in sorted(save_dir.glob(f"wandb/*run-*-{run_id}/run-{run_id}.wandb")):
            for payload in _log_payloads(log_file.read_bytes()):
                record = wandb_internal_pb2.Record.FromString(payload)
                if record.HasField("history"):
                    history.add_row(
                        {
                            item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item
                        }
                    )
    return history


@rank_zero_only
def continue_wandb_run(logger: WandbLogger, earlier: WandbHistory) -> None:
    """Carry on a resumed W&B run after what its earlier parts logged: its step goes on above
    theirs, and its summary holds the last epoch each probe published, so that an epoch the
    resumed part probes again (the earlier part logged it, then stopped before the checkpoint
    that records it was written) is not logged twice (:func:`isoprobe.probing.publish.log_probe`).
    Online, wandb takes both from the server; offline, only the earlier parts' local logs
    know them."""
    run = logger.experiment
    for key, epoch in earlier.last_epochs.items():
        held = run.summary.get(key)
        if held is None or held < epoch:
            run.summary[key] = epoch
    if earlier.last_step >= run.step:
        run.log({}, step=earlier.last_step + 1)
