"""What ``task=<name>`` is: the entry of :data:`isoprobe.tasks.TASKS` the runner reads.

The runner does the same for every task that runs a model (settings, data, weights, trainer,
callbacks, the memory check, the probes' records, ``summary.json``); a :class:`Task` says the
rest: whether it trains, what it checks before data and weights load, and what it does with
the trainer and the model. A task that runs no model (``analyze``) gives ``alone`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
from omegaconf import DictConfig

from isoprobe.models.base import ForecastModule

#: (the run's config, the trainer, the model, the data module) -> the task's results
RunModel = Callable[[DictConfig, L.Trainer, ForecastModule, Any], dict[str, Any]]


def no_check(cfg: DictConfig) -> None:
    """A task whose settings need no check beyond the schema's."""


@dataclass(frozen=True)
class Task:
    """One task: its name, whether it trains (and so needs training windows and may resume
    from a checkpoint), its check before data and weights load, and what it runs."""

    name: str
    trains: bool
    run: RunModel | None = None
    check: Callable[[DictConfig], None] = no_check
    #: a task that runs no model: the whole task, on the config alone
    alone: Callable[[DictConfig], dict[str, Any]] | None = None
