"""hydra/sweeper=grids: a multirun over the union of several grids, run by Hydra itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

APP = """
import json, sys
from pathlib import Path
import hydra

@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg):
    with open(cfg.record, "a") as f:
        f.write(json.dumps({"model": cfg.model, "length": cfg.length, "data": cfg.data}) + "\\n")

main()
"""

CONFIG = """
defaults:
  - override hydra/sweeper: grids
  - _self_
record: ???
model: none
data: none
length: 0
hydra:
  sweep:
    dir: {sweep_dir}
  sweeper:
    grids:
      - {{model: chronos, data: "synth_a,synth_b", length: "500,100"}}
      - {{model: lag_llama, data: real_a, length: "144,96"}}
"""


def run_sweep(tmp_path: Path, *overrides: str) -> list[dict]:
    """The jobs a ``-m`` run of a toy app on the grids above ran, in the order they ran."""
    (tmp_path / "conf" / "hydra" / "sweeper").mkdir(parents=True)
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "conf" / "config.yaml").write_text(CONFIG.format(sweep_dir=tmp_path / "sweep"))
    sweeper_yaml = (ROOT / "configs" / "hydra" / "sweeper" / "grids.yaml").read_text()
    (tmp_path / "conf" / "hydra" / "sweeper" / "grids.yaml").write_text(sweeper_yaml)
    record = tmp_path / "jobs.jsonl"
    command = [sys.executable, "app.py", "-m", f"record={record}", *overrides]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HYDRA_FULL_ERROR": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_the_sweep_runs_the_union_of_the_grids_without_cross_terms(tmp_path):
    jobs = run_sweep(tmp_path)
    assert [(j["model"], j["data"], j["length"]) for j in jobs] == [
        ("chronos", "synth_a", 500),
        ("chronos", "synth_a", 100),
        ("chronos", "synth_b", 500),
        ("chronos", "synth_b", 100),
        ("lag_llama", "real_a", 144),
        ("lag_llama", "real_a", 96),
    ]


def test_a_command_line_override_applies_to_every_grid(tmp_path):
    jobs = run_sweep(tmp_path, "length=64", "data=same")
    assert [(j["model"], j["data"], j["length"]) for j in jobs] == [
        ("chronos", "same", 64),
        ("lag_llama", "same", 64),
    ]


def test_a_job_that_two_grids_produce_runs_once(tmp_path):
    jobs = run_sweep(tmp_path, "model=moirai", "length=64", "data=same")
    assert [(j["model"], j["data"], j["length"]) for j in jobs] == [("moirai", "same", 64)]


def test_without_grids_the_sweeper_is_the_basic_sweep_of_its_params(tmp_path):
    jobs = run_sweep(tmp_path, "hydra.sweeper.grids=[]", "model=a,b")
    assert [(j["model"], j["data"], j["length"]) for j in jobs] == [
        ("a", "none", 0),
        ("b", "none", 0),
    ]
