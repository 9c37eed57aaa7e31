"""task=analyze on runs with damaged files: each is left out with its reason naming the file,
the study of the others is what it would be without it, and nothing raises a library error."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from isoprobe.analysis.study import AnalysisError, load_study
from isoprobe.tasks.analyze import note_runs_without, primary_forecast
from tests.analysis.test_analyze import fake_run
from tests.conftest import ROOT, compose_config

LAYERS = ("encoder.0", "encoder.1", "encoder.2", "encoder.3", "encoder.4")
METRICS = ("cos_inter", "isoscore")
#: run name -> (before test NMSE, cos_inter of the last block)
GOOD = {"a": (0.5, 0.1), "b": (0.9, 0.4), "c": (0.7, 0.3), "d": (1.2, 0.6), "e": (0.4, 0.2)}


def probed_run(directory: Path, nmse: float, value: float, epochs: int = 1) -> Path:
    """A probe run as run.py leaves it: config, overrides, summary.json (with the count of probe
    rows it wrote) and probe_metrics.csv (epochs x layers x metrics)."""
    rows = [
        {
            "probe": "isotropy",
            "epoch": epoch,
            "global_step": 10 * epoch,
            "layer": layer,
            "metric": metric,
            "value": value + 0.01 * (i + epoch),
            "note": "",
        }
        for epoch in range(epochs)
        for i, layer in enumerate(LAYERS)
        for metric in METRICS
    ]
    summary = {"task": "probe", "before": {"test/nmse": nmse}}
    summary["probe_rows"] = {"probe_metrics.csv": len(rows)}
    fake_run(directory, [f"data.dataset={directory.name}"], summary)
    config = yaml.safe_load((directory / ".hydra" / "config.yaml").read_text())
    config["task"]["name"] = "probe"
    config["data"]["dataset"] = directory.name
    (directory / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    pd.DataFrame(rows).to_csv(directory / "probe_metrics.csv", index=False)
    return directory


def good_runs(root: Path, epochs: int = 1) -> Path:
    for name, (nmse, value) in GOOD.items():
        probed_run(root / name, nmse, value, epochs)
    return root


def cut_mid_row(run: Path) -> None:
    path = run / "probe_metrics.csv"
    path.write_bytes(path.read_bytes()[:-9])


def cut_at_row_boundary(run: Path) -> None:
    """The last two layers' rows gone, every line whole (the issue's 'last' -> encoder.3)."""
    path = run / "probe_metrics.csv"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[: 1 + 6]))


def value_as_text(run: Path) -> None:
    path = run / "probe_metrics.csv"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines[:3], "isotropy,0,0,encoder.1,isoscore,lots,\n", *lines[4:]]))


def foreign_columns(run: Path) -> None:
    frame = pd.read_csv(run / "probe_metrics.csv").rename(columns={"value": "score"})
    frame.to_csv(run / "probe_metrics.csv", index=False)


def write(name: str, content: str | bytes):
    def damage(run: Path) -> None:
        path = run / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)

    return damage


DAMAGE = {
    "summary unparsable": (
        write("summary.json", '{"before": {"test/nmse": 0.'),
        r"summary\.json is not valid JSON",
    ),
    "summary a list": (
        write("summary.json", "[1, 2]"),
        r"summary\.json holds a list, not the run's summary",
    ),
    "csv cut mid-row": (cut_mid_row, r"probe_metrics\.csv is cut mid-row"),
    "csv garbage": (
        write("probe_metrics.csv", b"\x00\xff\x12garbage,\n\x9c\n"),
        r"probe_metrics\.csv is not a probe record file",
    ),
    "csv empty": (write("probe_metrics.csv", ""), r"probe_metrics\.csv is empty"),
    "text in value": (value_as_text, r"probe_metrics\.csv is not a probe record file \(.*'lots'"),
    "csv cut at a row boundary": (
        cut_at_row_boundary,
        r"incomplete probe records: .*probe_metrics\.csv holds 6 rows, the run wrote 10",
    ),
    "foreign columns": (
        foreign_columns,
        r"probe_metrics\.csv is not a probe record file: its columns are .*'score'",
    ),
    "config unparsable": (
        write(".hydra/config.yaml", "task: [probe\nmodel: {"),
        r"config\.yaml is not valid YAML",
    ),
    "config empty": (write(".hydra/config.yaml", ""), r"config\.yaml is empty"),
    "config a YAML tag": (
        write(".hydra/config.yaml", "task: !!python/object/apply:os.system ['touch PWNED']\n"),
        r"config\.yaml holds the YAML tag !!python/object/apply:os\.system, which is refused",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_run_is_left_out_with_its_reason_and_the_study_goes_on(tmp_path, case):
    damage, reason = DAMAGE[case]
    clean = load_study([str(good_runs(tmp_path / "clean"))])
    damaged_root = good_runs(tmp_path / "damaged")
    damage(probed_run(damaged_root / "z", 3.0, 0.9))
    study = load_study([str(damaged_root)])
    assert list(study.left_out) == ["z"]
    assert str(damaged_root / "z") in study.left_out["z"]
    assert re.search(reason, study.left_out["z"]), study.left_out["z"]
    pd.testing.assert_frame_equal(study.runs, clean.runs)
    pd.testing.assert_frame_equal(study.table, clean.table)
    assert not (tmp_path / "PWNED").exists() and not Path("PWNED").exists()


def test_a_run_cut_at_an_epoch_boundary_without_a_row_count_is_incomplete(tmp_path):
    """A run written before summary.json counted its rows: the last epoch must hold every
    (layer, metric) of the first."""
    root = good_runs(tmp_path / "runs", epochs=2)
    run = probed_run(root / "z", 3.0, 0.9, epochs=2)
    summary = json.loads((run / "summary.json").read_text())
    del summary["probe_rows"]
    (run / "summary.json").write_text(json.dumps(summary))
    path = run / "probe_metrics.csv"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-3]))
    study = load_study([str(root)])
    assert re.search(
        r"incomplete probe records: .*isotropy probe lacks 3 of the first probe's layer/metric "
        r"rows at its last probe, step \d+ \(e\.g\. encoder\.3/isoscore, encoder\.4/cos_inter",
        study.left_out["z"],
    )
    intact = load_study([str(good_runs(tmp_path / "intact", epochs=2))])
    pd.testing.assert_frame_equal(study.table, intact.table)


def test_a_layer_not_measured_at_the_last_epoch_is_not_incomplete(tmp_path):
    run = probed_run(tmp_path / "runs" / "a", 0.5, 0.1, epochs=2)
    frame = pd.read_csv(run / "probe_metrics.csv")
    last = (frame["epoch"] == 1) & (frame["layer"] == "encoder.4")
    error = frame[last].iloc[:1].assign(metric="error", value=np.nan, note="too few tokens")
    frame = pd.concat([frame[~last], error], ignore_index=True)
    frame.to_csv(run / "probe_metrics.csv", index=False)
    summary = json.loads((run / "summary.json").read_text())
    summary["probe_rows"]["probe_metrics.csv"] = len(frame)
    (run / "summary.json").write_text(json.dumps(summary))
    assert not load_study([str(tmp_path / "runs")]).left_out


def test_a_forecast_that_is_not_finite_is_named_and_left_out_of_that_metrics_tests(tmp_path):
    root = good_runs(tmp_path / "runs")
    probed_run(root / "z", 3.0, 0.9)
    (root / "z" / "summary.json").write_text('{"before": {"test/nmse": Infinity, "test/wql": 0.2}}')
    study = load_study([str(root)])
    assert not study.left_out
    assert study.partly_left_out == {
        "z": "summary.json has forecast metrics that are not finite (before_test_nmse = inf): "
        "the run is left out of the tests of those metrics"
    }
    runs = study.runs.set_index("run")
    assert np.isnan(runs.at["z", "before_test_nmse"]) and runs.at["z", "before_test_wql"] == 0.2
    assert runs["before_test_nmse"].drop("z").tolist() == [v for v, _ in GOOD.values()]


def test_one_runs_nan_forecast_leaves_that_run_out_not_the_metric(tmp_path):
    root = good_runs(tmp_path / "runs")
    probed_run(root / "z", 3.0, 0.9)
    (root / "z" / "summary.json").write_text('{"before": {"test/nmse": NaN}}')
    study = load_study([str(root)])
    assert primary_forecast(study, "test_nmse") == "before_test_nmse"
    note_runs_without(study, "before_test_nmse")
    assert list(study.partly_left_out) == ["z"]
    assert "before_test_nmse = nan" in study.partly_left_out["z"]


def test_a_trained_run_whose_after_forecast_is_nan_gets_no_final_forecast_from_before(tmp_path):
    """Five runs trained; the sixth's after-forecast is NaN: it is not taken for a zero-shot
    run (final_* = its before_*), after_* stays the primary metric, and the run is named."""
    root = tmp_path / "runs"
    for name, (nmse, value) in GOOD.items():
        run = probed_run(root / name, nmse, value)
        summary = {"before": {"test/nmse": nmse}, "after": {"test/nmse": nmse / 2}}
        (run / "summary.json").write_text(json.dumps(summary))
    z = probed_run(root / "z", 3.0, 0.9)
    (z / "summary.json").write_text('{"before": {"test/nmse": 3}, "after": {"test/nmse": NaN}}')
    study = load_study([str(root)])
    assert np.isnan(study.runs.set_index("run").at["z", "final_test_nmse"])
    assert primary_forecast(study, "test_nmse") == "after_test_nmse"
    note_runs_without(study, "after_test_nmse")
    assert list(study.partly_left_out) == ["z"]
    assert "after_test_nmse = nan" in study.partly_left_out["z"]


def test_a_mistyped_path_among_several_is_named_and_alone_is_an_error(tmp_path, caplog):
    root = good_runs(tmp_path / "runs")
    typo = str(tmp_path / "rnus")
    with caplog.at_level(logging.WARNING):
        study = load_study([str(root), typo])
    assert study.unmatched == [typo] and len(study.runs) == len(GOOD)
    assert f"analyze.runs: {typo} matches no run directory" in caplog.text
    with pytest.raises(AnalysisError, match=f"no runs found .*Looked in: {typo}"):
        load_study([typo])


def test_every_run_unreadable_is_one_error_listing_each_reason(tmp_path):
    run = probed_run(tmp_path / "runs" / "a", 0.5, 0.1)
    (run / "summary.json").write_text("[]")
    with pytest.raises(AnalysisError, match=r"can be analysed: a: .*summary\.json holds a list"):
        load_study([str(tmp_path / "runs")])


def test_the_jobs_of_a_stopped_grids_sweep_that_never_started_are_left_out_by_name(tmp_path):
    """experiment=isotropy/context_length (two grids, 44 jobs) stopped after its third job."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    cfg = compose_config(tmp_path, ["experiment=isotropy/context_length"])
    OmegaConf.save(cfg, sweep / "multirun.yaml")
    for number in range(3):
        probed_run(sweep / str(number), 0.5 + number, 0.1 * number)
    study = load_study([str(sweep)])
    assert len(study.runs) == 3
    assert sorted(study.left_out, key=int) == [str(n) for n in range(3, 44)]
    chronos, lag_llama = cfg.hydra.sweeper.grids
    first_set = chronos.data.split(",")[1]
    assert f"data={first_set}" in study.left_out["3"] and "model=chronos" in study.left_out["3"]
    assert "never started: job 43 of the sweep" in study.left_out["43"]
    assert "model=lag_llama" in study.left_out["43"]


def test_the_report_and_the_terminal_list_every_run_left_out_and_why(tmp_path):
    root = good_runs(tmp_path / "runs")
    (probed_run(root / "y", 3.0, 0.9) / "summary.json").write_text("{not json")
    probed_run(root / "z", 3.0, 0.9)
    (root / "z" / "summary.json").write_text('{"before": {"test/nmse": Infinity}}')
    out = tmp_path / "analysis"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run.py"),
            "task=analyze",
            f"analyze.runs=[{root},{tmp_path / 'typo'}]",
            "analyze.n_boot=50",
            "analyze.n_perm=50",
            "logger=none",
            f"hydra.run.dir={out}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    page = (out / "report.html").read_text()
    assert "1 runs left out:" in page and "summary.json is not valid JSON" in page
    assert "1 runs left out of some tests:" in page and "before_test_nmse = inf" in page
    assert "match no run" in page and str(tmp_path / "typo") in page
    assert set(pd.read_csv(out / "study.csv")["run"]) == {*GOOD, "z"}
    printed = done.stdout.splitlines()
    assert "isoprobe analyze: 6 runs (1 left out)" in printed, done.stdout
    left_out = [line for line in printed if line.startswith(f"  left out: {root / 'y'}: ")]
    assert len(left_out) == 1 and "summary.json is not valid JSON" in left_out[0]
    partly = f"  left out of some tests: {root / 'z'}: "
    assert any(line.startswith(partly) and "before_test_nmse = inf" in line for line in printed)
