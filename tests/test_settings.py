"""Every numeric setting is checked before anything loads, naming its key and its range; an
input isoprobe refuses ends a run with that message alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from isoprobe.errors import IsoprobeError
from isoprobe.settings import SCHEMA, SettingsError, check_settings
from isoprobe.tasks.user_errors import exit_on_user_error, is_own_error
from tests.conftest import ROOT, compose_config

REFUSED = [
    ("model.lora.alpha=nan", "model.lora.alpha must be a finite number in (0, 1e+06], got nan"),
    ("model.lora.r=2.5", "model.lora.r must be a whole number in [1, 4096], got 2.5"),
    ("model.lora.r=0", "model.lora.r must be a whole number in [1, 4096], got 0"),
    ("model.lora.r=1000000000", "model.lora.r must be a whole number in [1, 4096], got 1000000000"),
    ("model.lora.dropout=1.5", "model.lora.dropout must be a finite number in [0, 1), got 1.5"),
    ("regularizer=isotropy regularizer.weight=inf", "regularizer.weight must be a finite number"),
    ("analyze.n_boot=-5", "analyze.n_boot must be a whole number in [0, 100000], got -5"),
    ("analyze.n_boot=-1", "analyze.n_boot must be a whole number in [0, 100000], got -1"),
    ("analyze.n_boot=lots", "analyze.n_boot must be a whole number in [0, 100000], got 'lots'"),
    ("analyze.n_boot=1000000000", "analyze.n_boot must be a whole number in [0, 100000]"),
    ("analyze.n_perm=-1", "analyze.n_perm must be a whole number in [0, 100000], got -1"),
    (
        "data.context_length=0",
        "data.context_length must be a whole number in [2, 100000] or null, got 0",
    ),
    ("data.noise_std=-0.1", "data.noise_std must be a finite number in [0, 1e+06], got -0.1"),
    ("callbacks.probe.max_tokens=1", "callbacks.probe.max_tokens must be a whole number"),
    ("model.num_samples=0", "model.num_samples must be a whole number in [1, 1e+06], got 0"),
    ("model=toto model.num_samples=-3", "model.num_samples must be a whole number in [1, 1e+06]"),
    ("model=moirai model.num_samples=2.5", "model.num_samples must be a whole number"),
]


def config(tmp_path, *overrides: str):
    return compose_config(tmp_path, [o for item in overrides for o in item.split()])


@pytest.mark.parametrize(("overrides", "message"), REFUSED)
def test_a_setting_out_of_range_is_refused_naming_its_key_and_range(tmp_path, overrides, message):
    with pytest.raises(SettingsError) as refused:
        check_settings(config(tmp_path, overrides))
    assert message in str(refused.value)


def test_every_violation_is_named_in_one_message(tmp_path):
    cfg = config(tmp_path, "model.lora.r=2.5 analyze.n_perm=-1 data.batch_size=0")
    with pytest.raises(SettingsError) as refused:
        check_settings(cfg)
    lines = str(refused.value).splitlines()[1:]
    assert [line.split(" must")[0].strip() for line in lines] == [
        "model.lora.r",
        "data.batch_size",
        "analyze.n_perm",
    ]


@pytest.mark.parametrize(
    "model", ["chronos", "chronos_bolt", "patchtst", "moirai", "llm", "visionts"]
)
def test_the_shipped_defaults_are_in_range(tmp_path, model):
    check_settings(config(tmp_path, f"model={model} regularizer=isotropy"))


SHIPPED_DATA = sorted(
    str(path.relative_to(ROOT / "configs" / "data").with_suffix(""))
    for path in (ROOT / "configs" / "data").rglob("*.yaml")
)
SHIPPED_EXPERIMENTS = sorted(
    str(path.relative_to(ROOT / "configs" / "experiment").with_suffix(""))
    for path in (ROOT / "configs" / "experiment").rglob("*.yaml")
)


@pytest.mark.parametrize("data", SHIPPED_DATA)
def test_every_shipped_data_set_is_in_range(tmp_path, data):
    check_settings(config(tmp_path, f"data={data}"))


@pytest.mark.parametrize("experiment", SHIPPED_EXPERIMENTS)
def test_every_shipped_experiment_is_in_range(tmp_path, experiment):
    check_settings(config(tmp_path, f"experiment={experiment}"))


def test_an_off_regulariser_is_not_checked(tmp_path):
    check_settings(config(tmp_path, "regularizer=none"))


def test_every_range_says_what_it_allows():
    for ranges in SCHEMA.values():
        for allowed in ranges.values():
            words = allowed.words()
            assert words.startswith(("a whole number in ", "a finite number in ")), words


def test_own_refusals_are_isoprobes_and_a_librarys_error_is_not():
    with pytest.raises(SettingsError) as own:
        raise SettingsError("x")
    assert is_own_error(own.value)
    with pytest.raises(ValueError) as library:
        int("not a number")
    assert not is_own_error(library.value)  # raised in the interpreter, not isoprobe's code
    with pytest.raises(ZeroDivisionError) as bug:
        1 / 0  # noqa: B018
    assert not is_own_error(bug.value)


def test_exit_on_user_error_prints_the_message_and_exits_1(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as ended, exit_on_user_error():
        raise IsoprobeError("model.lora.r must be ...")
    assert ended.value.code == 1
    assert capsys.readouterr().err == "Error: model.lora.r must be ...\n"
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(IsoprobeError), exit_on_user_error():
        raise IsoprobeError("shown with its traceback")


@pytest.mark.slow
def test_run_py_refuses_a_setting_in_one_message_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "run.py", "model.lora.r=2.5", "logger=none", f"hydra.run.dir={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "model.lora.r must be a whole number in [1, 4096], got 2.5" in done.stderr
    assert "Traceback" not in done.stderr and "Error executing job" not in done.stderr
    assert not (out / "summary.json").exists() and not (out / "checkpoints").exists()
