"""What ``task=<name>`` is: the :class:`Task` that its config ``configs/task/<name>.yaml`` names
with ``_target_``, as a ``configs/model/*.yaml`` names its model's class.

The runner does the same for every task that runs a model (settings, data, weights, trainer,
callbacks, the memory check, the probes' records, ``summary.json``); a :class:`Task` says the
rest: whether it trains, what it checks before data and weights load, and what it does with
the trainer and the model. A task that runs no model (``analyze``) gives ``alone`` instead.

A task of one's own is a :class:`Task` in one's own module and a config that names it
(``_target_: mypackage.tasks.MY_TASK``) in a config directory on Hydra's search path; nothing in
isoprobe lists the tasks. The config's other keys are the task's settings, read by its
functions from ``cfg.task``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from isoprobe.errors import IsoprobeError
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


class UnknownTaskError(IsoprobeError, ValueError):
    """``task._target_`` names no :class:`Task`, or one of another name than ``task.name``."""


def known_tasks() -> list[str]:
    """The ``task=`` choices of this run: the ``task/*.yaml`` of every config directory on
    Hydra's search path (none outside a Hydra run)."""
    if not HydraConfig.initialized():
        return []
    sources = HydraConfig.get().runtime.config_sources
    found = (Path(s.path).glob("task/*.yaml") for s in sources if s.schema == "file")
    return sorted({path.stem for paths in found for path in paths})


def _locate(target: str) -> Any:
    """The object ``target`` (``module.NAME``) names."""
    module, _, name = target.rpartition(".")
    if not module:
        raise ImportError(f"{target!r} is not of the form module.NAME")
    try:
        return getattr(importlib.import_module(module), name)
    except AttributeError:
        raise ImportError(f"module {module!r} has no {name!r}") from None


def task_of(cfg: DictConfig) -> Task:
    """The :class:`Task` that the run's task config names with ``_target_`` (module docstring);
    a config that names none is refused with the known tasks and the fix."""
    name, target = cfg.task.get("name"), cfg.task.get("_target_")
    task = None
    if not target:
        problem = "its config has no _target_"
    else:
        try:
            task = _locate(target)
            problem = f"task._target_={target!r} is a {type(task).__name__}, not a Task"
        except ImportError as err:
            problem = f"task._target_={target!r} cannot be imported ({err})"
    if not isinstance(task, Task):
        known = ", ".join(known_tasks()) or "the configs of configs/task"
        raise UnknownTaskError(
            f"task {name!r} names no Task: {problem}. Choose task= one of {known}, or give "
            "your task's config a _target_ naming a Task object (docs/adding-a-task.md)"
        )
    if task.name != name:
        raise UnknownTaskError(
            f"task.name={name!r}, but task._target_={target!r} is the task {task.name!r}: "
            f"set task.name={task.name}"
        )
    return task
