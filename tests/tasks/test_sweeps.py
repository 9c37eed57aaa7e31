"""Sweeps beyond one process (issue 32): a sweep that is run again goes on where it stopped, a
failed job does not stop the others, submitit's local launcher gives the basic launcher's runs,
the SLURM launcher's sbatch script asks for what the trainer uses, torchrun equals one process,
and an Optuna search finds its best trial, is not run again over its directory, and says why
when every trial failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from isoprobe.analysis.study import load_study
from isoprobe.tasks import run_task
from tests.conftest import ROOT, TINY_MODEL, TINY_RUN, compose_config
from tests.conftest import run_py_at as run_py

pytestmark = pytest.mark.slow

TINY = [o for o in TINY_RUN if not o.startswith(("trainer.max_epochs", "data.max_train"))]
BOLT = ["model=chronos_bolt", *TINY_MODEL["chronos_bolt"], *TINY]
PROBE_SWEEP = ["-m", "task=probe", *BOLT, "data=energy,weather"]


def started(job: Path) -> int:
    """How many times a job's task started in ``job`` (its run.log, which each run appends to)."""
    return (job / "run.log").read_text().count("model.adapt=")


def probe_table(run: Path) -> pd.DataFrame:
    table = pd.read_csv(run / "probe_metrics.csv")
    return table.sort_values(["epoch", "layer", "metric"]).reset_index(drop=True)


def test_a_killed_sweep_run_again_skips_finished_jobs_and_resumes_the_stopped_one(tmp_path):
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "run.py"), "-m", *BOLT, "model.checkpoint=scratch"]
    command += ["task.evaluate_before=false", "trainer.max_epochs=4", "data=energy,weather"]
    command += ["data.max_train_windows=64", f"hydra.sweep.dir={sweep}"]
    first = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    stopped = sweep / "1" / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 600
    while not stopped.is_file() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # job 1 is killed after an epoch, before its end
    first.wait()
    finished = (sweep / "0" / "summary.json").read_bytes()
    assert not (sweep / "1" / "summary.json").exists()

    again = run_py(*command[2:], cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (sweep / "0" / "summary.json").read_bytes() == finished  # not rerun
    assert started(sweep / "0") == 1 and started(sweep / "1") == 2
    log = (sweep / "1" / "run.log").read_text()
    assert f"this job was stopped; it resumes from {stopped}" in log
    # one run of 4 epochs in two parts, logged as job 0's uninterrupted run was
    epochs = [
        sorted(set(pd.read_csv(sweep / job / "csv" / "metrics.csv")["epoch"].dropna()))
        for job in ("0", "1")
    ]
    assert epochs[0] == epochs[1] and {0, 1, 2, 3} <= set(epochs[1])
    assert len(load_study([str(sweep)]).runs) == 2


def test_a_failed_job_does_not_stop_the_sweep_and_is_listed_with_its_error(tmp_path):
    sweep = tmp_path / "sweep"
    done = run_py(
        "-m", "task=probe", *BOLT, "data.dataset=nosuch,vic_elec", f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"1 jobs of the sweep {sweep} failed (the others ran)" in done.stderr
    assert "job 0: UnknownDatasetError: unknown data set 'nosuch'" in done.stderr
    assert (sweep / "1" / "summary.json").is_file()
    assert "Traceback" in json.loads((sweep / "0" / "failed.json").read_text())["traceback"]
    study = load_study([str(sweep)])
    assert list(study.runs["run"]) == ["1"]
    assert study.left_out["0"].startswith("failed: UnknownDatasetError: unknown data set")


def test_another_sweep_into_a_finished_sweeps_directory_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    first = run_py(*PROBE_SWEEP, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    before = {p: p.read_bytes() for p in sweep.rglob("summary.json")}
    other = [o if o != "data=energy,weather" else "data=energy,retail" for o in PROBE_SWEEP]
    done = run_py(*other, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert done.returncode == 1
    assert f"hydra.sweep.dir={sweep} already holds 2 finished runs (0, 1) of another" in done.stderr
    assert {p: p.read_bytes() for p in sweep.rglob("summary.json")} == before

    again = run_py(*PROBE_SWEEP, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.read_bytes() for p in sweep.rglob("summary.json")} == before
    assert started(sweep / "0") == started(sweep / "1") == 1


def test_submitit_local_gives_the_runs_and_analysis_of_the_basic_launcher(tmp_path):
    basic, local = tmp_path / "basic", tmp_path / "local"
    analyze = "+hydra.callbacks.analyze._target_=isoprobe.tasks.sweep_analysis.AnalyzeSweep"
    for sweep, launcher in ((basic, []), (local, ["hydra/launcher=submitit_local"])):
        done = run_py(*PROBE_SWEEP, *launcher, analyze, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    assert any((local / ".submitit").iterdir())  # the jobs ran in submitit's processes
    for job in ("0", "1"):
        pd.testing.assert_frame_equal(probe_table(basic / job), probe_table(local / job))
        one, two = (json.loads((s / job / "summary.json").read_text()) for s in (basic, local))
        assert one["before"] == two["before"]
    tables = [pd.read_csv(s / "analysis" / "study.csv") for s in (basic, local)]
    pd.testing.assert_frame_equal(*tables)


def test_the_slurm_launcher_asks_for_the_trainers_nodes_tasks_and_gpus(tmp_path, monkeypatch):
    """The sbatch script as submitit renders it (a stand-in ``srun`` on the PATH: submitit looks
    for one), from the launcher config with hydra-submitit-launcher's own mapping of its keys."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cfg = compose_config(
        tmp_path,
        ["hydra/launcher=submitit_slurm", "trainer=ddp", "trainer.devices=4",
         "trainer.num_nodes=2", "hydra.launcher.partition=gpu", "hydra.launcher.account=lab",
         f"hydra.sweep.dir={tmp_path / 'sweep'}"],
    )  # fmt: skip
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher.pop("_target_").endswith("SlurmLauncher")
    executor = submitit.AutoExecutor(
        cluster="slurm",
        folder=launcher.pop("submitit_folder"),
        slurm_max_num_timeout=launcher.pop("max_num_timeout"),
    )
    shared = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(
        **{k if k in shared else f"slurm_{k}": v for k, v in launcher.items()}
    )
    script = executor._executor._make_submission_file_text("python -u run.py", "uid")
    lines = set(script.splitlines())
    assert {
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
    } <= lines
    assert {"#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --time=240"} <= lines
    assert "#SBATCH --signal=USR2@120" in lines


def test_lightning_requeues_on_submitits_signal_under_slurm(monkeypatch):
    """submitit's handler for its preemption signal gives way to Lightning's, which listens to
    that signal (isoprobe/tasks/slurm_requeue.py): a trainer built with the plugins registers
    its requeue handler for SIGUSR2, where it would otherwise leave submitit's in place."""
    import lightning as L

    from isoprobe.tasks.slurm_requeue import slurm_plugins

    def submitits(signum, frame):
        raise AssertionError("submitit's handler ran")

    previous = signal.signal(signal.SIGUSR2, submitits)
    try:
        assert slurm_plugins() == []  # not a SLURM task
        for name, value in {"SUBMITIT_EXECUTOR": "slurm", "SLURM_NTASKS": "1",
                            "SLURM_JOB_NAME": "isoprobe", "SLURM_JOB_ID": "7"}.items():  # fmt: skip
            monkeypatch.setenv(name, value)
        (environment,) = slurm_plugins()
        assert environment.requeue_signal == signal.SIGUSR2 and environment.auto_requeue
        trainer = L.Trainer(plugins=[environment], accelerator="cpu", logger=False)
        trainer._signal_connector.register_signal_handlers()
        handler = signal.getsignal(signal.SIGUSR2)
        assert handler is not submitits and "_HandlersCompose" in type(handler).__name__
        trainer._signal_connector.teardown()
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_torchrun_with_two_cpu_processes_equals_one_process(tmp_path):
    common = ["task=probe", *BOLT, "model.checkpoint=bundled", "task.evaluate_before=false"]
    run_task(compose_config(tmp_path / "one", [*common, "trainer=cpu"]))  # in this process
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    two = subprocess.run(
        [*torchrun, str(ROOT / "run.py"), *common, "trainer=ddp", "trainer.accelerator=cpu",
         "trainer.devices=2", "trainer.sync_batchnorm=false", f"hydra.run.dir={tmp_path / 'two'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    one_table, two_table = probe_table(tmp_path / "one"), probe_table(tmp_path / "two")
    assert len(one_table) > 0 and not (one_table.metric == "error").any()
    pd.testing.assert_frame_equal(one_table, two_table, rtol=1e-9, atol=1e-12)


SEARCH = ["-m", "experiment=search/lora", *BOLT, "model.checkpoint=scratch"]
SEARCH += ["model.allow_random_weights=true", "data.max_train_windows=32", "trainer.max_epochs=1"]
SEARCH += ["~hydra.callbacks.analyze"]


def test_an_optuna_search_finds_its_best_trial_and_is_not_run_again_over_it(tmp_path):
    sweep = tmp_path / "search"
    command = [*SEARCH, "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={sweep}"]
    done = run_py(*command, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = {}
    for job in sorted(p for p in sweep.iterdir() if p.name.isdigit()):
        wql = json.loads((job / "summary.json").read_text())["after"]["test/wql"]
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        trials[job.name] = (wql, overrides)
    assert len(trials) == 4
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    wql, overrides = min(trials.values(), key=lambda trial: trial[0])
    assert best["best_value"] == pytest.approx(wql, rel=1e-12)
    assert {f"{k}={v}" for k, v in best["best_params"].items()} <= set(overrides)
    assert len(load_study([str(sweep)]).runs) == 4
    written = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}

    again = run_py(*command, cwd=tmp_path)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert f"hydra.sweep.dir={sweep} already holds a search: 4 trial runs (0, 1, 2, 3)" in (
        again.stderr
    )
    assert "Run the search into a new directory" in again.stderr
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == written


def test_a_search_whose_every_trial_failed_names_each_trials_error(tmp_path):
    sweep = tmp_path / "search"
    done = run_py(
        *SEARCH, "data.dataset=nosuch", "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "No trials are completed yet" not in done.stderr
    assert f"Every trial of the search {sweep} failed, so it has no best trial" in done.stderr
    for trial in ("0", "1"):
        assert f"trial {trial}: UnknownDatasetError: unknown data set 'nosuch'" in done.stderr
    assert not (sweep / "optimization_results.yaml").exists()


def test_without_the_optuna_sweeper_hydra_scans_isoprobes_plugins_without_a_warning():
    """Without the cluster extra, Hydra's start-up scan imports hydra_plugins.isoprobe_sweepers
    quietly: the grid sweeper is found, the search sweeper is not defined."""
    scan = (
        "import sys, warnings\n"
        "sys.modules['hydra_plugins.hydra_optuna_sweeper'] = None\n"
        "sys.modules['hydra_plugins.hydra_optuna_sweeper.optuna_sweeper'] = None\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.sweeper import Sweeper\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    names = sorted(p.__name__ for p in Plugins.instance().discover(Sweeper))\n"
        "ours = [str(w.message) for w in caught if 'isoprobe_sweepers' in str(w.message)]\n"
        "print(ours, names)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", scan], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    ours, names = out.rsplit("] [", 1)
    assert ours == "["
    assert "'GridsSweeper'" in names and "SearchSweeper" not in names
