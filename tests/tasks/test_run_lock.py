"""A run directory belongs to one live run (isoprobe.tasks.run_lock)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from isoprobe.tasks import run_task
from isoprobe.tasks.run_lock import LOCK_NAME, RunDirectoryInUse, run_directory_lock
from tests.conftest import ROOT, TINY, compose_config

HOLDER = """
import sys, time
from isoprobe.tasks.run_lock import run_directory_lock
with run_directory_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(run_dir: Path) -> subprocess.Popen:
    """Another process holding run_dir's lock (it says ``held`` once it does)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK")}
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout.readline().strip() == "held"
    return process


def _stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    process.send_signal(sig)
    process.wait(timeout=30)
    process.stdout.close()


def test_a_second_run_in_a_live_runs_directory_is_refused_naming_the_first(tmp_path):
    first = _holder(tmp_path)
    try:
        host = socket.gethostname()
        with pytest.raises(RunDirectoryInUse, match=rf"pid {first.pid} on host {host}"):
            with run_directory_lock(tmp_path):
                pass
        # the refusal leaves the holder's lock as it was
        owner = json.loads((tmp_path / LOCK_NAME).read_text())
        assert owner["pid"] == first.pid and owner["host"] == host
    finally:
        _stop(first)


def test_a_killed_runs_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    dead = _holder(tmp_path)
    _stop(dead, signal.SIGKILL)  # no release: the file stays, naming the dead process
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == dead.pid
    with caplog.at_level(logging.WARNING), run_directory_lock(tmp_path) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"taking over the lock of pid {dead.pid}" in caplog.text
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_from_another_host_is_refused_and_says_how_to_override(tmp_path):
    lock = tmp_path / LOCK_NAME
    lock.write_text(json.dumps({"pid": 1234, "host": "node-elsewhere", "started": "then"}))
    with pytest.raises(RunDirectoryInUse, match=rf"pid 1234 on host node-elsewhere.*delete {lock}"):
        with run_directory_lock(tmp_path):
            pass
    assert json.loads(lock.read_text())["host"] == "node-elsewhere"


def test_ddp_ranks_other_than_zero_do_not_take_the_lock(tmp_path, monkeypatch):
    first = _holder(tmp_path)
    try:
        monkeypatch.setenv("LOCAL_RANK", "1")  # what Lightning's launcher gives rank 1
        with run_directory_lock(tmp_path) as path:
            assert path is None
    finally:
        _stop(first)


def test_the_lock_is_released_after_a_run_and_after_a_failed_one(tmp_path):
    base = [*TINY, "task=probe", "model.checkpoint=scratch", "logger=none"]
    run_task(compose_config(tmp_path, [*base, "task.evaluate_before=false"]))
    assert (tmp_path / "probe_metrics.csv").is_file()
    assert not (tmp_path / LOCK_NAME).exists()
    with pytest.raises(MemoryError):
        run_task(compose_config(tmp_path, [*base, "data.eval_batch_size=100000"]))
    assert not (tmp_path / LOCK_NAME).exists()


@pytest.mark.slow
def test_two_runs_started_in_one_directory_the_second_refuses_and_the_first_keeps_its_records(
    tmp_path,
):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    common = [*TINY, "model.checkpoint=scratch", "task.evaluate_before=false"]
    command = [sys.executable, "run.py", *common, f"hydra.run.dir={tmp_path}"]
    first = subprocess.Popen(
        [*command, "trainer.max_epochs=2"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / LOCK_NAME).exists():
        assert first.poll() is None and time.monotonic() < deadline, "the first run took no lock"
        time.sleep(0.05)
    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert first.wait(timeout=600) == 0
    assert second.returncode != 0
    assert f"in use by pid {first.pid} on host {socket.gethostname()}" in second.stderr
    records = pd.read_csv(tmp_path / "probe_metrics.csv")
    assert sorted(records.epoch.unique()) == [0, 1, 2]
    assert not records.duplicated(["epoch", "layer", "metric"]).any()
    assert not (tmp_path / LOCK_NAME).exists()
