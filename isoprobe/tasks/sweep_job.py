"""One job of a multirun (``python run.py -m ...``), run so that a sweep can be run again.

Hydra runs job ``i`` of a sweep in ``<sweep dir>/<i>``. A second run of the same sweep into the
same directory (:mod:`isoprobe.tasks.output_guard` lets only the same sweep through) goes on
where the first one stopped, job by job:

- a job whose run finished (``summary.json``) is not run again: its recorded results stand;
- a training job that was stopped (a checkpoint, no ``summary.json``: the sweep was killed, or
  SLURM preempted the job) resumes from its newest checkpoint, ``checkpoints/last.ckpt`` (the
  end of its last epoch) or Lightning's ``hpc_ckpt_<n>.ckpt`` (saved on SLURM's signal);
- a job that failed left its error in ``failed.json`` and runs again.

A job that fails does not stop the sweep: its error goes to ``<job dir>/failed.json`` and the
log, the job returns no results, and the next job starts.
:class:`isoprobe.tasks.sweep_outcome.SweepOutcome` names the failed jobs when the sweep ends,
and ``task=analyze`` lists each with its error.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from isoprobe.analysis.run_files import FAILED_FILE
from isoprobe.errors import IsoprobeError
from isoprobe.tasks.task import task_of

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"


class ObjectiveError(IsoprobeError, ValueError):
    """``objective`` names no metric of the run's test forecast."""


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The newest of ``checkpoints/last.ckpt`` and Lightning's ``hpc_ckpt_<n>.ckpt`` in
    ``run_dir`` (None when there is neither)."""
    found = [*run_dir.glob("checkpoints/last.ckpt"), *run_dir.glob("hpc_ckpt_*.ckpt")]
    return max(found, key=lambda p: p.stat().st_mtime_ns, default=None)


def run_sweep_job(cfg: DictConfig, run: Callable[[DictConfig], dict[str, Any]]) -> dict | None:
    """Run one job of a sweep with ``run`` (``run_task``), as the module docstring says: its
    results, the recorded ones of a job that finished earlier, or None when it failed."""
    run_dir = Path(cfg.paths.output_dir)
    summary = run_dir / SUMMARY_FILE
    if summary.is_file():
        log.info("%s: this job finished in an earlier run of the sweep; skipped", run_dir)
        return json.loads(summary.read_text())
    (run_dir / FAILED_FILE).unlink(missing_ok=True)
    checkpoint = newest_checkpoint(run_dir)
    if checkpoint is not None and cfg.get("ckpt_path") is None:
        if task_of(cfg).trains:  # a task that trains resumes from its checkpoint
            log.info("%s: this job was stopped; it resumes from %s", run_dir, checkpoint)
            with open_dict(cfg):
                cfg.ckpt_path = str(checkpoint)
    try:
        return run(cfg)
    except Exception as err:
        error = f"{type(err).__name__}: {err}"
        log.error("%s: this job failed; the sweep goes on. %s", run_dir, error)
        run_dir.mkdir(parents=True, exist_ok=True)
        record = {"error": error, "traceback": traceback.format_exc()}
        (run_dir / FAILED_FILE).write_text(json.dumps(record, indent=2))
        return None


def objective_value(results: dict | None, metric: str) -> float | None:
    """``metric`` (such as ``test/wql``) of the run's final test forecast (after training; the
    zero-shot one for a task that does not train), the value a search sweeper optimises; None
    for a failed job (Hydra's Optuna sweeper then marks the trial failed and goes on)."""
    if results is None:
        return None
    forecast = results.get("after") or results.get("before") or {}
    if metric not in forecast:
        known = ", ".join(sorted(forecast)) or "none: the run made no test forecast"
        raise ObjectiveError(
            f"objective={metric!r} is not a metric of the run's test forecast ({known})"
        )
    return float(forecast[metric])
