"""Nothing overwrites a run's records: task=analyze into a run's or a sweep's directory, two
analyses into one directory, and a run into a finished run's directory are refused
before anything is written (isoprobe.tasks.output_guard)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from isoprobe.analysis.study import load_study
from isoprobe.tasks.analyze import run_analyze
from isoprobe.tasks.run_lock import RunDirectoryInUse
from tests.conftest import TINY_MODEL, TINY_RUN
from tests.conftest import run_py_at as run_py
from tests.tasks.test_run_lock import _holder, _stop

pytestmark = pytest.mark.slow

TINY = [o for o in TINY_RUN if not o.startswith(("trainer.max_epochs", "data.max_train"))]
SWEEP = ["-m", "task=probe", "model=chronos_bolt", *TINY_MODEL["chronos_bolt"], *TINY]
SWEEP += ["data=energy,weather"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A finished two-job probe sweep with the CSV logger."""
    root = tmp_path_factory.mktemp("guard") / "sweep"
    done = run_py(*SWEEP, f"hydra.sweep.dir={root}", cwd=root.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def contents(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_an_analysis_into_a_runs_directory_is_refused_and_the_run_kept(sweep):
    run = sweep / "0"
    before = contents(sweep)
    assert {".hydra/config.yaml", "run.log", "summary.json", "csv/metrics.csv"} <= set(
        contents(run)
    )
    done = run_py("task=analyze", f"analyze.runs={sweep}", f"hydra.run.dir={run}", cwd=sweep)
    assert done.returncode != 0
    assert f"task=analyze would write into {run}, which holds a run's" in done.stderr
    assert "hydra.run.dir=<a new directory>" in done.stderr
    assert contents(sweep) == before
    assert len(load_study([str(sweep)]).runs) == 2


def test_an_analysis_into_the_sweep_directory_is_refused(sweep):
    before = contents(sweep)
    done = run_py("task=analyze", f"analyze.runs={sweep}", f"hydra.run.dir={sweep}", cwd=sweep)
    assert done.returncode != 0 and "multirun.yaml" in done.stderr
    assert contents(sweep) == before


def test_a_run_into_a_finished_runs_directory_is_refused_and_changes_nothing(sweep):
    run = sweep / "0"
    before = contents(sweep)
    single = [o for o in SWEEP if o not in ("-m", "data=energy,weather")]
    done = run_py(*single, "data=energy", f"hydra.run.dir={run}", cwd=sweep.parent)
    assert done.returncode == 1
    assert f"hydra.run.dir={run} holds a finished run (summary.json)" in done.stderr
    assert "Traceback" not in done.stderr
    assert contents(sweep) == before


def test_a_second_analysis_into_a_directory_in_use_is_refused_before_it_writes(sweep, tmp_path):
    out = tmp_path / "analysis"
    out.mkdir()
    first = _holder(out)  # an analysis writing there (it holds out/run.lock)
    try:
        done = run_py("task=analyze", f"analyze.runs={sweep}", f"hydra.run.dir={out}", cwd=sweep)
        assert done.returncode != 0 and f"in use by pid {first.pid}" in done.stderr
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # no .hydra, no run.log
        cfg = OmegaConf.create(
            {
                "analyze": {"runs": [str(sweep)], "allow_mixed": False},
                "paths": {"output_dir": str(out)},
            }
        )
        with pytest.raises(RunDirectoryInUse, match=f"pid {first.pid}"):
            run_analyze(cfg)
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]
    finally:
        _stop(first)


def test_a_run_counts_its_probe_rows_in_its_summary(sweep):
    for run in (sweep / "0", sweep / "1"):
        rows = json.loads((run / "summary.json").read_text())["probe_rows"]
        assert rows == {name: len(pd.read_csv(run / name)) for name in rows}
        assert set(rows) == {"probe_metrics.csv", "rank_metrics.csv"}


def test_a_job_of_a_stopped_sweep_that_never_started_is_named(sweep, tmp_path):
    stopped = tmp_path / "stopped"
    shutil.copytree(sweep, stopped)
    shutil.rmtree(stopped / "1")
    study = load_study([str(stopped)])
    assert list(study.runs["run"]) == ["0"]
    assert list(study.left_out) == ["1"]
    assert f"never started: job 1 of the sweep {stopped}" in study.left_out["1"]
    assert "data=weather" in study.left_out["1"] and "model=chronos_bolt" in study.left_out["1"]
