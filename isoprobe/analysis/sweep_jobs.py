"""The jobs a multirun directory's sweep was to run, and those that never started.

Hydra writes ``<sweep dir>/multirun.yaml`` before the first job: the sweeper's ``params`` (and
``grids`` for ``hydra/sweeper=grids``) and the command line's overrides. Expanded the way the
sweeper expands them, they give every job in the order of its number; with the project's
``hydra.sweep.subdir: ${hydra.job.num}``, job ``i`` runs in ``<sweep dir>/<i>``. A job whose
directory holds no ``.hydra/config.yaml`` never started (the sweep was stopped before it).
Sweeps with another subdir or another sweeper cannot be counted this way and are not checked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from isoprobe.analysis.run_files import UnreadableRun, read_yaml

log = logging.getLogger(__name__)

SWEEP_FILE = "multirun.yaml"
#: the subdir under which a job's number alone names its directory
JOB_SUBDIR = "${hydra.job.num}"
COUNTED_SWEEPERS = ("BasicSweeper", "GridsSweeper")


def expected_jobs(sweep_dir: Path) -> list[list[str]] | None:
    """Every job of the sweep in ``sweep_dir`` (its overrides), numbered by position; None when
    the sweep cannot be counted (module docstring), or when the directory has no
    ``multirun.yaml`` (a search's: Hydra's Optuna sweeper writes none)."""
    if not (sweep_dir / SWEEP_FILE).is_file():
        return None
    try:
        config = read_yaml(sweep_dir / SWEEP_FILE, dict)
    except UnreadableRun as err:
        log.warning("cannot count the jobs of the sweep %s: %s", sweep_dir, err)
        return None
    return sweep_jobs(config, str(sweep_dir))


def sweep_jobs(config: Mapping[str, Any], sweep: str) -> list[list[str]] | None:
    """Every job (its overrides), numbered by position, of the sweep whose config (with its
    ``hydra`` node, interpolations unresolved) is ``config``; None when the sweep cannot be
    counted (module docstring). ``sweep`` names it in warnings."""
    hydra = config.get("hydra") or {}
    sweeper = hydra.get("sweeper") or {}
    subdir = (hydra.get("sweep") or {}).get("subdir")
    if subdir != JOB_SUBDIR or not str(sweeper.get("_target_")).endswith(COUNTED_SWEEPERS):
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from hydra_plugins.isoprobe_sweepers.grids import grid_jobs

    params = sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()]
    arguments += [str(o) for o in (hydra.get("overrides") or {}).get("task") or []]
    parser = OverridesParser.create()
    try:
        return grid_jobs(parser, sweeper.get("grids") or [{}], parser.parse_overrides(arguments))
    except (HydraException, ValueError, TypeError, AttributeError) as err:
        log.warning("cannot count the jobs of the sweep %s: %s", sweep, err)
        return None


def never_started(sweep_dir: Path) -> dict[Path, str]:
    """The directory of each job of the sweep that never started -> why it is missing."""
    jobs = expected_jobs(sweep_dir) or []
    return {
        sweep_dir / str(number): (
            f"never started: job {number} of the sweep {sweep_dir} ({' '.join(job)}) has no "
            "run directory (the sweep was stopped before it)"
        )
        for number, job in enumerate(jobs)
        if not (sweep_dir / str(number) / ".hydra" / "config.yaml").is_file()
    }


def sweeps_under(path: Path) -> list[Path]:
    """``path`` if it is a sweep directory, and every sweep directory below it."""
    if not path.is_dir():
        return []
    return sorted({found.parent for found in path.glob(f"**/{SWEEP_FILE}")})
