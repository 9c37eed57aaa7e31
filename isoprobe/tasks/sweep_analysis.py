"""A Hydra callback that runs ``task=analyze`` on a sweep when its last job has ended, so that
one ``python run.py -m experiment=<study>`` gives the report (``<sweep dir>/analysis/``).

Hydra turns an exception raised in a callback into a warning and exits 0; an analysis that
isoprobe refuses (:mod:`isoprobe.tasks.user_errors`) ends the sweep with its message and exit
code 1 instead (:mod:`isoprobe.tasks.hydra_callback`), so that a sweep without its report does
not look like one with it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from isoprobe.tasks.analyze import run_analyze
from isoprobe.tasks.hydra_callback import IsoprobeCallback

log = logging.getLogger(__name__)


class AnalyzeSweep(IsoprobeCallback):
    """``hydra.callbacks.analyze: {_target_: isoprobe.tasks.sweep_analysis.AnalyzeSweep}``;
    the run's ``analyze.*`` settings apply (configs/analyze/default.yaml), updated by the
    callback's arguments."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.sweep_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # resolved once, at the start: the directory name holds the start time
        self.sweep_dir = Path(config.hydra.sweep.dir)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self.sweep_dir or Path(config.hydra.sweep.dir)
        analyze = {**OmegaConf.to_container(config.analyze, resolve=True), **self.options}
        # the group of the sweep's runs (isoprobe.tasks.loggers.sweep_group)
        group = OmegaConf.select(config, "logger.wandb.group", default=None) or sweep_dir.name
        analyze.update(runs=[str(sweep_dir)], group=analyze.get("group") or group)
        # the jobs' logger settings hold ${hydra:runtime...}, which is unset once they ended:
        # the analysis needs only whether W&B was on and its project
        wandb = "wandb" in (config.get("logger") or {})
        project = OmegaConf.select(config, "logger.wandb.project", default=None)
        cfg = OmegaConf.create(
            {
                "analyze": analyze,
                "paths": {"output_dir": str(sweep_dir / "analysis")},
                "logger": {"wandb": {"project": project}} if wandb else None,
            }
        )
        log.info("analysing the sweep %s", sweep_dir)
        run_analyze(cfg)
