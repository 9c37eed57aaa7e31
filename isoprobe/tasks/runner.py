"""One entry for every task: build data, model, callbacks, loggers and trainer from the Hydra
config, run the task (finetune | probe | pretrain) and print where the outputs are."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from isoprobe.analysis.run_files import PROMISED_ROWS
from isoprobe.data import dataset_spec
from isoprobe.models.adaptation import check_adapt_needs_weights, parameter_counts
from isoprobe.models.base import ForecastModule
from isoprobe.models.build import build_model
from isoprobe.models.regularizer import IsotropyRegularizer
from isoprobe.probing import ProbeCallback
from isoprobe.settings import check_settings
from isoprobe.tasks.loggers import (
    LoggersSavedWithCheckpoint,
    build_loggers,
    continue_wandb_run,
    read_wandb_history,
    wandb_run_ids,
    wandb_save_dirs,
)
from isoprobe.tasks.memory import check_memory_fits
from isoprobe.tasks.quiet import quiet_lightning
from isoprobe.tasks.resume import (
    RunIdentity,
    check_resume_checkpoint,
    check_same_data,
    data_identity,
)
from isoprobe.tasks.run_lock import run_directory_lock
from isoprobe.tasks.slurm_requeue import slurm_plugins
from isoprobe.tasks.summary import format_summary
from isoprobe.tasks.task import Task, task_of

log = logging.getLogger(__name__)


def _single_log_stream() -> None:
    """Lightning's package logger prints through its own console handler AND propagates to the
    root logger that Hydra configured: drop its handler so every line appears once, in Hydra's
    format, in the console and in the run's log file."""
    if logging.getLogger().hasHandlers():
        logging.getLogger("lightning").handlers.clear()


def run_task(cfg: DictConfig) -> dict[str, Any]:
    """Run the task that ``cfg.task`` names (:func:`isoprobe.tasks.task.task_of`) and return its
    results (forecast metrics, probe records path).

    The run holds its output directory for its whole duration: a second run started in the
    same directory is refused (:mod:`isoprobe.tasks.run_lock`)."""
    _single_log_stream()
    quiet_lightning()
    task = task_of(cfg)
    check_settings(cfg)  # every numeric setting, before data, weights or outputs
    if task.alone is not None:
        return task.alone(cfg)
    task.check(cfg)  # a wrong setting fails before data and model load
    model_settings = {k: cfg.model.get(k) for k in ("checkpoint", "adapt", "allow_random_weights")}
    check_adapt_needs_weights(task.name, task.trains, model_settings, cfg.get("ckpt_path"))
    dataset_spec(cfg.data.dataset)  # an unknown name fails here, not wrapped by instantiate
    output_dir = Path(cfg.paths.output_dir)
    with run_directory_lock(output_dir):
        return _run_in(cfg, task, output_dir)


def _run_in(cfg: DictConfig, task: Task, output_dir: Path) -> dict[str, Any]:
    L.seed_everything(cfg.seed, workers=True)

    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit" if task.trains else "validate")
    model = build_model(cfg.model, datamodule)
    model.regularizer = IsotropyRegularizer.from_config(
        OmegaConf.to_container(cfg.regularizer, resolve=True) if cfg.get("regularizer") else None
    )
    if model.regularizer is not None:
        model.regularizer.layer_names(model)  # a layer the model lacks fails before training
    adapt = cfg.model.get("adapt", "full")
    identity = check_resume_checkpoint(cfg.get("ckpt_path"), model, adapt if task.trains else None)
    data = data_identity(datamodule)
    if task.trains:  # probing or compressing saved weights on other data is a use, not a slip
        check_same_data(identity, data, bool(cfg.get("resume_allow_data_change", False)))
    loggers = build_loggers(cfg.get("logger"), identity.get("wandb_ids", {}))
    resolved = model.resolved_checkpoint.describe()
    callbacks = [
        instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c and "_target_" in c
    ]
    probes = [c for c in callbacks if isinstance(c, ProbeCallback)]
    wandb_dirs = wandb_save_dirs(loggers, identity.get("wandb_dirs", {}))
    # the run's zero-shot forecast, unless resume_allow_data_change moved it to other data
    before = identity.get("before") if identity.get("data") == data else None
    callbacks.append(RunIdentity(wandb_run_ids(loggers), resolved, data, wandb_dirs, adapt, before))
    callbacks.append(LoggersSavedWithCheckpoint())
    plugins = [*(instantiate(p) for p in cfg.trainer.get("plugins") or []), *slurm_plugins()]
    trainer: L.Trainer = instantiate(
        cfg.trainer, callbacks=callbacks, logger=list(loggers.values()) or False, plugins=plugins
    )
    counts = parameter_counts(model)
    log.info(
        "model.adapt=%s: %d of %d parameters trainable",
        cfg.model.get("adapt", "full"),
        counts["trainable_parameters"],
        counts["total_parameters"],
    )
    run_info = {
        "resolved_checkpoint": resolved,
        "data_report": dict(datamodule.report),
        **counts,
    }
    params = {
        k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
        for k, v in cfg.items()
        if k != "hydra"
    }
    for lg in trainer.loggers:
        lg.log_hyperparams({**params, **run_info})
    _continue_resumed_wandb_runs(loggers, identity, wandb_dirs)

    try:
        results = _run(cfg, task, trainer, model, datamodule, probes)
        results.update(run_info)
        _report(trainer, output_dir, results)
    finally:
        _finish_wandb()
    return results


def _continue_resumed_wandb_runs(
    loggers: dict[str, Any], identity: dict[str, Any], wandb_dirs: dict[str, list[str]]
) -> None:
    """Each W&B run resumed from the checkpoint goes on after what its earlier parts logged."""
    for name, run_id in identity.get("wandb_ids", {}).items():
        lg = loggers.get(name)
        if isinstance(lg, WandbLogger) and lg.version == run_id:
            continue_wandb_run(lg, read_wandb_history(wandb_dirs[name], run_id))


def _run(
    cfg: DictConfig,
    task: Task,
    trainer: L.Trainer,
    model: ForecastModule,
    datamodule,
    probes: list[ProbeCallback],
) -> dict[str, Any]:
    """Run ``task``; its results with the records of ``probes``, the probe callbacks built."""
    check_memory_fits(model, datamodule, trainer, task.trains)
    results: dict[str, Any] = {"task": task.name, **task.run(cfg, trainer, model, datamodule)}
    results["probe_records"] = [record for probe in probes for record in probe.records]
    results[PROMISED_ROWS] = _probe_rows(probes, Path(cfg.paths.output_dir))
    return results


def _probe_rows(probes: list[ProbeCallback], output_dir: Path) -> dict[str, int]:
    """How many rows each probe wrote to its CSV file in the run directory (summary.json
    keeps the count, so that an analysis knows a file cut short:
    :func:`isoprobe.analysis.run_files.read_probe_file`)."""
    rows: dict[str, int] = {}
    for probe in probes:
        if not probe.records:  # a probe with records was set up: it knows its files
            continue
        for path, count in probe.csv_rows().items():
            if path.parent.resolve() == output_dir.resolve():
                rows[path.name] = rows.get(path.name, 0) + count
    return rows


#: what a run leaves in its output directory, listed at its end when present
OUTPUTS = (
    "probe_metrics.csv",
    "probe_trajectories.png",
    "rank_metrics.csv",
    "rank_trajectories.png",
    "flow_of_ranks",
    "compression.md",
    "compressed",
    "checkpoints",
    "summary.json",
)


@rank_zero_only
def _report(trainer: L.Trainer, output_dir: Path, results: dict[str, Any]) -> None:
    records = results.get("probe_records", [])
    serialisable = {k: v for k, v in results.items() if k != "probe_records"}
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "summary.json").write_text(json.dumps(serialisable, indent=2, default=str))
    table = format_summary(records, results.get("before"), results.get("after"))
    print(f"\nisoprobe {results['task']} finished; weights: {results['resolved_checkpoint']}")
    print(f"outputs: {output_dir.resolve()}")
    for name in OUTPUTS:
        if (output_dir / name).exists():
            print(f"  {output_dir / name}")
    if "export_dir" in results:
        print(f"  exported model: {results['export_dir']}")
    if table:
        print("\n" + table)


def _finish_wandb() -> None:
    """Close the W&B run so that the next job of a multirun starts a new one."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        wandb.finish()
