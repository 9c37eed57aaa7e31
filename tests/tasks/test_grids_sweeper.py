"""hydra/sweeper=grids: a multirun over the union of several grids, run by Hydra itself."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins

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


@pytest.mark.parametrize(
    ("grid", "named"),
    [
        (["foo"], "hydra.sweeper.grids[1] = ['foo'] is not a grid"),
        ({"seed": [1, 2]}, "hydra.sweeper.grids[1].seed = [1, 2]: a grid's values are one "),
        ({"seed": {"a": 1}}, "hydra.sweeper.grids[1].seed = {'a': 1}"),
    ],
)
def test_a_grid_that_is_not_keys_to_values_is_refused_naming_it(grid, named):
    grids = sweeper_module()
    with pytest.raises(grids.GridError, match=re.escape(named)):
        grids.GridsSweeper(grids=[{"model": "chronos"}, grid])


def test_a_grid_whose_values_do_not_parse_is_refused_naming_it():
    grids = sweeper_module()
    with pytest.raises(grids.GridError, match=re.escape("hydra.sweeper.grids[0] = {'seed': '1,'}")):
        grids.grid_jobs(OverridesParser.create(), [{"seed": "1,"}], [])


def sweeper_module():
    """The grids module as Hydra's plugin scan leaves it: the scan executes plugin modules
    again, so a test takes the classes it compares with from the module after the scan."""
    Plugins.instance()
    return importlib.import_module("hydra_plugins.isoprobe_sweepers.grids")
