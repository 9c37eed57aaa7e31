"""Hydra's Optuna sweeper, ending a search whose every trial failed with isoprobe's message.

A trial that fails does not stop the search (:mod:`isoprobe.tasks.sweep_job`): Optuna marks it
failed and asks for the next. When every trial failed, Hydra's Optuna sweeper asks Optuna for
the best trial and ends in Optuna's own ``ValueError: No trials are completed yet``, which says
neither that every trial failed nor why. :class:`SearchSweeper` (``hydra/sweeper=search``,
``configs/hydra/sweeper/search.yaml``: the Optuna sweeper's settings, this class) ends such a
search with one message instead: each trial with the error its ``failed.json`` holds, or, for
trials that ran without failing, that they returned no objective.

Hydra imports every module under ``hydra_plugins`` at start-up. Without hydra-optuna-sweeper
(the ``cluster`` extra) this one defines no sweeper, rather than have every run print Hydra's
warning that the plugin failed to import.
"""

from __future__ import annotations

from pathlib import Path

from hydra.errors import CompactHydraException

from isoprobe.analysis.run_files import FAILED_FILE
from isoprobe.tasks.sweep_outcome import failed_jobs


class EveryTrialFailed(CompactHydraException, ValueError):
    """No trial of the search finished (Hydra prints its message alone, exit code 1)."""


def every_trial_failed(sweep_dir: Path) -> EveryTrialFailed:
    """The error that ends the search in ``sweep_dir``, none of whose trials finished."""
    failed = failed_jobs(sweep_dir)
    if failed:
        listed = "\n".join(f"  trial {trial}: {error}" for trial, error in failed.items())
        why = (
            f"{len(failed)} failed with an error:\n{listed}\nEach trial's {FAILED_FILE} holds "
            "its traceback. Fix what they report (a value of hydra.sweeper.params that the "
            "run refuses can be left out of its range) and run the search into a new "
            "directory."
        )
    else:
        why = (
            "none returned a value to optimise: set objective=<a metric of the test forecast>, "
            "such as objective=test/wql, and run the search into a new directory."
        )
    return EveryTrialFailed(
        f"Every trial of the search {sweep_dir} failed, so it has no best trial: {why}"
    )


try:
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
except ImportError:
    OptunaSweeper = None

if OptunaSweeper is not None:

    class SearchSweeper(OptunaSweeper):
        """``hydra/sweeper=search``: Hydra's Optuna sweeper, with the message of the module
        docstring when every trial failed."""

        def sweep(self, arguments: list[str]) -> None:
            try:
                return super().sweep(arguments)
            except ValueError:
                sweep_dir = Path(str(self.sweeper.config.hydra.sweep.dir))
                if any(sweep_dir.glob("**/summary.json")):
                    raise
                raise every_trial_failed(sweep_dir) from None
