"""A Hydra callback that ends a sweep with exit code 1, naming each job that failed.

A job that fails does not stop its sweep (:mod:`isoprobe.tasks.sweep_job`): it leaves its error
in ``<job dir>/failed.json`` and the next job starts. When the last job has ended (and after
the sweep's analysis, which lists them too), :class:`SweepOutcome` prints the failed jobs with
their errors and exits 1, so that a sweep with failed jobs does not look like a complete one.
What to do next depends on the sweeper: a grid's sweep run again with the same command reruns
only those (and any that never ran), the finished jobs skipped; a search
(``hydra/sweeper=search``) cannot go on in its directory (:mod:`isoprobe.tasks.output_guard`
refuses it), so its best finished trial stands in ``optimization_results.yaml`` and a new search
needs a new directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from isoprobe.analysis.run_files import FAILED_FILE, read_failure
from isoprobe.errors import IsoprobeError
from isoprobe.tasks.hydra_callback import IsoprobeCallback
from isoprobe.tasks.output_guard import SEARCH_RESULTS, is_search


class JobsFailed(IsoprobeError, RuntimeError):
    """Jobs of the sweep failed (each named with its error)."""


def failed_jobs(sweep_dir: Path) -> dict[str, str]:
    """Job directory (relative to ``sweep_dir``) -> the error its job failed with."""
    return {
        str(path.parent.relative_to(sweep_dir)): read_failure(path.parent) or ""
        for path in sorted(sweep_dir.glob(f"**/{FAILED_FILE}"))
    }


def what_next(config: DictConfig) -> str:
    """What to do about a sweep's failed jobs, for the sweeper of ``config``."""
    if is_search(config):
        return (
            f"The search's best finished trial is in {SEARCH_RESULTS}. A search does not go on "
            "in its directory: to try the failed trials' settings again, run the search into a "
            "new directory (leave hydra.sweep.dir at its default, or set another one)."
        )
    return "Run the same command again to rerun the failed jobs; the finished ones are skipped."


class SweepOutcome(IsoprobeCallback):
    """``hydra.callbacks.sweep_outcome`` (configs/hydra/default.yaml)."""

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # resolved once, at the start: the directory name holds the start time
        self.sweep_dir = Path(str(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = self.sweep_dir or Path(str(config.hydra.sweep.dir))
        failed = failed_jobs(sweep_dir)
        if failed:
            listed = "\n".join(f"  job {job}: {error}" for job, error in failed.items())
            raise JobsFailed(
                f"{len(failed)} jobs of the sweep {sweep_dir} failed (the others ran):\n"
                f"{listed}\nEach job's {FAILED_FILE} holds its traceback. {what_next(config)}"
            )
