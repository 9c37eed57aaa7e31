"""Keep a command's outputs off the records of runs already written.

- ``task=analyze`` never writes into a directory that holds a run's records (its
  ``.hydra/config.yaml`` of another task, ``summary.json``, probe CSVs, ``csv/metrics.csv``,
  ``checkpoints/``) nor into a sweep directory (``multirun.yaml``): its own ``.hydra/`` and
  ``run.log`` would replace the run's, and the run would vanish from its sweep's study.
- A run is not rerun into a ``hydra.run.dir`` that holds a finished run (``summary.json``)
  unless it resumes (``ckpt_path=...``): it would replace that run's records.
- A sweep rerun into a ``hydra.sweep.dir`` that holds finished runs (``summary.json``) goes
  on where the first run stopped (:mod:`isoprobe.tasks.sweep_job`: finished jobs are skipped,
  stopped ones resume) when it is the same sweep: the same jobs, in the same order, as the
  directory's ``multirun.yaml``. Any other sweep there is refused as a whole, before any job
  starts: its job ``i`` would run over another job's records. So is a sweep whose jobs cannot
  be counted (another ``hydra.sweep.subdir``, or a search's directory). A sweep that resumes
  from a checkpoint (``ckpt_path=...``) is allowed, as resuming a single run in place is.
- A search (a sweeper that picks its jobs as it goes, such as Optuna's: ``hydra/sweeper=search``)
  is not run again into a ``hydra.sweep.dir`` that holds a search's trials or its
  ``optimization_results.yaml``: it would number its trials from 0 again, over the runs there,
  and rewrite the results. Hydra's Optuna sweeper cannot go on with a search in its directory.

Hydra writes a run's ``.hydra/`` and opens its ``run.log`` before the task starts, so the check
runs in :class:`OutputGuard`, a Hydra callback (``configs/hydra/default.yaml``) whose
``on_run_start`` / ``on_multirun_start`` come before anything is written; ``task=analyze``
checks again where it writes (the sweep's own analysis, or a caller without Hydra). The
callback also takes the run directory's lock (:mod:`isoprobe.tasks.run_lock`) from before Hydra
writes until the run has ended, so that a second command in a live run's directory is refused
before its ``.hydra/`` replaces the first one's. Hydra turns an exception raised in a callback
into a warning and goes on, so a refusal there ends the process (``SystemExit``: the message
and exit code 1; :mod:`isoprobe.tasks.hydra_callback`).
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from isoprobe.analysis.run_files import UnreadableRun, read_config
from isoprobe.analysis.sweep_jobs import COUNTED_SWEEPERS, expected_jobs, sweep_jobs
from isoprobe.errors import IsoprobeError
from isoprobe.tasks.hydra_callback import IsoprobeCallback
from isoprobe.tasks.run_lock import run_directory_lock

#: what a run writes into its directory, besides ``.hydra/config.yaml``
RUN_RECORDS = (
    "summary.json",
    "probe_metrics.csv",
    "rank_metrics.csv",
    "csv/metrics.csv",
    "checkpoints",
    "compression.csv",
)
SWEEP_FILE = "multirun.yaml"
#: where Hydra's Optuna sweeper writes a finished search's best trial
SEARCH_RESULTS = "optimization_results.yaml"

log = logging.getLogger(__name__)


class OutputRefused(IsoprobeError, RuntimeError):
    """The output directory holds records that this command would overwrite."""


def run_records(directory: Path) -> list[str]:
    """What in ``directory`` belongs to a run or a sweep (empty when nothing does)."""
    found = [name for name in (*RUN_RECORDS, SWEEP_FILE) if (directory / name).exists()]
    config = directory / ".hydra" / "config.yaml"
    if config.is_file():
        try:
            task = (read_config(directory).get("task") or {}).get("name")
        except UnreadableRun:
            task = None
        if task != "analyze":
            found.insert(0, ".hydra/config.yaml of a run")
    return found


def check_analysis_directory(directory: Path) -> None:
    """Refuse to write an analysis into ``directory`` if it holds a run's or a sweep's
    records."""
    found = run_records(Path(directory))
    if found:
        raise OutputRefused(
            f"task=analyze would write into {directory}, which holds a run's or a sweep's "
            f"records ({', '.join(found)}): its .hydra/config.yaml and run.log would be "
            "replaced and the run lost from its study. Give the analysis its own directory: "
            "leave hydra.run.dir at its default, or set hydra.run.dir=<a new directory> (the "
            "runs to read go in analyze.runs)."
        )


def finished_runs(sweep_dir: Path) -> list[Path]:
    """The run directories under ``sweep_dir`` whose run finished (wrote ``summary.json``)."""
    if not sweep_dir.is_dir():
        return []
    return sorted(
        summary.parent
        for summary in sweep_dir.glob("**/summary.json")
        if (summary.parent / ".hydra" / "config.yaml").is_file()
    )


def check_sweep_directory(sweep_dir: Path, config: DictConfig) -> None:
    """Refuse the sweep ``config`` into ``sweep_dir`` when runs in it have finished, unless it
    is the sweep that ran there (the same jobs in the same order)."""
    done = finished_runs(sweep_dir)
    if not done:
        return
    earlier = expected_jobs(sweep_dir)
    if earlier is not None and earlier == sweep_jobs(
        OmegaConf.to_container(config, resolve=False), str(sweep_dir)
    ):
        log.info("%s: %d jobs finished earlier and are skipped", sweep_dir, len(done))
        return
    listed = ", ".join(str(run.relative_to(sweep_dir)) for run in done[:10])
    more = f" and {len(done) - 10} more" if len(done) > 10 else ""
    raise OutputRefused(
        f"hydra.sweep.dir={sweep_dir} already holds {len(done)} finished runs ({listed}{more}) "
        "of another sweep, or of one whose jobs cannot be counted (its multirun.yaml): this "
        "sweep would run over their records. Rerunning the same command goes on where that "
        "sweep stopped; for another sweep use a new directory (leave hydra.sweep.dir at its "
        f"default, or set another one), or delete {sweep_dir} (or those runs' directories)."
    )


def is_search(config: DictConfig) -> bool:
    """Whether the sweeper of ``config`` picks its jobs as it goes (a search, such as Optuna's),
    rather than expanding a grid that is known before the first job."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default=""))
    return not target.endswith(COUNTED_SWEEPERS)


def started_runs(sweep_dir: Path) -> list[Path]:
    """The run directories under ``sweep_dir`` whose run started (``.hydra/config.yaml``)."""
    if not sweep_dir.is_dir():
        return []
    return sorted(config.parent.parent for config in sweep_dir.glob("**/.hydra/config.yaml"))


def check_search_directory(sweep_dir: Path) -> None:
    """Refuse a search into ``sweep_dir`` when a search ran there (its trials, or its
    ``optimization_results.yaml``): it would run its trials over theirs and rewrite the
    results."""
    trials = started_runs(sweep_dir)
    results = (sweep_dir / SEARCH_RESULTS).is_file()
    if not trials and not results:
        return
    held = []
    if trials:
        listed = ", ".join(str(run.relative_to(sweep_dir)) for run in trials[:10])
        more = f" and {len(trials) - 10} more" if len(trials) > 10 else ""
        finished = sum((run / "summary.json").is_file() for run in trials)
        held.append(f"{len(trials)} trial runs ({listed}{more}), {finished} of them finished")
    if results:
        held.append(f"{SEARCH_RESULTS}, the best trial of a finished search")
    raise OutputRefused(
        f"hydra.sweep.dir={sweep_dir} already holds a search: {' and '.join(held)}. A search "
        "run again there would number its trials from 0 over those runs and rewrite "
        f"{SEARCH_RESULTS}, and Hydra's Optuna sweeper cannot go on with a search in its "
        "directory. Run the search into a new directory (leave hydra.sweep.dir at its default, "
        f"or set another one), or delete {sweep_dir} to run it again from the start."
    )


def check_run_directory(run_dir: Path) -> None:
    """Refuse a run into ``run_dir`` when a run there finished (``summary.json``): it would
    replace that run's summary and records."""
    if (run_dir / "summary.json").is_file() and (run_dir / ".hydra" / "config.yaml").is_file():
        raise OutputRefused(
            f"hydra.run.dir={run_dir} holds a finished run (summary.json): this run would "
            "replace its records. Run in a new directory (leave hydra.run.dir at its default), "
            "delete that run to run it again, or resume it with ckpt_path=<its checkpoint>."
        )


class OutputGuard(IsoprobeCallback):
    """``hydra.callbacks.output_guard``: the checks of the module docstring, before Hydra
    writes anything."""

    def __init__(self) -> None:
        self._held = ExitStack()

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(str(config.hydra.run.dir)).expanduser().resolve()
        if config.task.name == "analyze":
            check_analysis_directory(run_dir)
        elif config.get("ckpt_path") is None:
            check_run_directory(run_dir)
        self._held.enter_context(run_directory_lock(run_dir))

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._held.close()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).expanduser().resolve()
        if config.task.name == "analyze":
            check_analysis_directory(sweep_dir)
        if is_search(config):
            check_search_directory(sweep_dir)
        elif config.get("ckpt_path") is None:
            check_sweep_directory(sweep_dir, config)
