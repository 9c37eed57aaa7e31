"""Experiment loggers from the ``logger`` config group, W&B offline when no key is set."""

from __future__ import annotations

import logging
import netrc
import os
import secrets
import string
from pathlib import Path
from typing import Any

from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)

WANDB_HOST = "api.wandb.ai"


def wandb_key_configured() -> bool:
    """A W&B API key in the environment or in ~/.netrc (what ``wandb login`` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc(Path.home() / ".netrc").authenticators(WANDB_HOST) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def new_run_id() -> str:
    """A W&B-style run id: 8 random lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def build_loggers(logger_cfg: DictConfig | None, resume_ids: dict[str, Any]) -> dict[str, Logger]:
    """Config name -> logger; W&B goes offline without a key and resumes ``resume_ids``."""
    loggers: dict[str, Logger] = {}
    for name, cfg in (logger_cfg or {}).items():
        if "_target_" not in cfg:
            continue
        if cfg._target_.endswith("WandbLogger"):
            with open_dict(cfg):
                if not cfg.get("offline") and os.environ.get("WANDB_MODE") != "offline":
                    if not wandb_key_configured():
                        log.warning(
                            "W&B: no API key configured, logging OFFLINE to %s "
                            "(upload later with `wandb sync`).",
                            cfg.save_dir,
                        )
                        cfg.offline = True
                if resume_ids.get(name):
                    cfg.id = resume_ids[name]
                    cfg.resume = "allow"
                elif not cfg.get("id"):
                    # fixed now, not when the run starts, so that checkpoints can store it
                    cfg.id = new_run_id()
        loggers[name] = instantiate(cfg)
    return loggers


def wandb_run_ids(loggers: dict[str, Logger]) -> dict[str, Any]:
    """Config name -> run id of each W&B logger, stored in checkpoints to resume the same run."""
    return {name: lg.version for name, lg in loggers.items() if isinstance(lg, WandbLogger)}
