"""Experiment loggers from the ``logger`` config group, W&B offline when no key is set."""

from __future__ import annotations

import csv
import logging
from typing import Any

import wandb
from hydra.utils import instantiate
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from omegaconf import DictConfig, open_dict
from wandb.errors import AuthenticationError
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


def build_loggers(logger_cfg: DictConfig | None, resume_ids: dict[str, Any]) -> dict[str, Logger]:
    """Config name -> logger; W&B goes offline without a key and resumes ``resume_ids``."""
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
        loggers[name] = instantiate(cfg, _convert_="all")
    return loggers


def wandb_run_ids(loggers: dict[str, Logger]) -> dict[str, Any]:
    """Config name -> run id of each W&B logger, stored in checkpoints to resume the same run."""
    return {name: lg.version for name, lg in loggers.items() if isinstance(lg, WandbLogger)}
