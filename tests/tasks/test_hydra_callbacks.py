"""isoprobe's Hydra callbacks, called as Hydra calls them (``hydra._internal.callbacks``): an
error in one ends the command instead of becoming Hydra's warning, a search is not run again
over a search's directory, and a sweep with failed jobs says what to do for its sweeper."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra._internal.callbacks import Callbacks
from omegaconf import DictConfig, OmegaConf

from isoprobe.tasks.hydra_callback import IsoprobeCallback
from isoprobe.tasks.output_guard import OutputGuard, OutputRefused
from isoprobe.tasks.sweep_outcome import SweepOutcome
from tests.conftest import compose_config


class Broken(IsoprobeCallback):
    def __init__(self, error: Exception) -> None:
        self.error = error

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        raise self.error


def notify_multirun_end(callback: IsoprobeCallback) -> None:
    callbacks = Callbacks()
    callbacks.callbacks.append(callback)
    callbacks.on_multirun_end(config=OmegaConf.create({}))


def test_an_isoprobe_error_in_a_callback_ends_the_command_with_its_message(capsys):
    with pytest.raises(SystemExit) as ended:
        notify_multirun_end(Broken(OutputRefused("that directory is taken: use another one")))
    assert ended.value.code == 1
    assert capsys.readouterr().err == "Error: that directory is taken: use another one\n"


def test_a_bug_in_a_callback_ends_the_command_with_its_traceback(capsys):
    with pytest.raises(SystemExit) as ended:
        notify_multirun_end(Broken(ZeroDivisionError("division by zero")))
    assert ended.value.code == 1
    assert "Traceback" in capsys.readouterr().err


def finished_trial(sweep: Path, number: int) -> Path:
    trial = sweep / str(number)
    (trial / ".hydra").mkdir(parents=True)
    (trial / ".hydra" / "config.yaml").write_text("task:\n  name: finetune\n")
    (trial / "summary.json").write_text(json.dumps({"after": {"test/wql": 0.5}}))
    return trial


def contents(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")
            if p.is_file()}  # fmt: skip


def test_a_search_run_again_into_its_directory_is_refused_before_anything_is_written(
    tmp_path, capsys
):
    sweep = tmp_path / "search"
    finished_trial(sweep, 0)
    (sweep / "optimization_results.yaml").write_text("name: optuna\nbest_value: 0.5\n")
    before = contents(sweep)
    cfg = compose_config(tmp_path, ["experiment=search/lora", f"hydra.sweep.dir={sweep}"])
    callbacks = Callbacks()
    callbacks.callbacks.append(OutputGuard())
    with pytest.raises(SystemExit) as ended:
        callbacks.on_multirun_start(config=cfg)
    assert ended.value.code == 1
    message = capsys.readouterr().err
    assert message.startswith(f"Error: hydra.sweep.dir={sweep} already holds a search: 1 trial")
    assert "(0), 1 of them finished and optimization_results.yaml" in message
    assert "Run the search into a new directory" in message
    assert contents(sweep) == before


def test_a_search_into_a_new_directory_goes_ahead(tmp_path):
    cfg = compose_config(tmp_path, ["experiment=search/lora", f"hydra.sweep.dir={tmp_path}/new"])
    OutputGuard().on_multirun_start(config=cfg)


def failed_job(sweep: Path, number: int) -> None:
    job = sweep / str(number)
    job.mkdir(parents=True)
    (job / "failed.json").write_text(json.dumps({"error": "ValueError: r must be > 0"}))


@pytest.mark.parametrize(
    ("sweeper", "next_step", "not_said"),
    [
        (["experiment=search/lora"], "A search does not go on in its directory", "skipped"),
        ([], "Run the same command again to rerun the failed jobs; the finished ones are skipped",
         "optimization_results.yaml"),
    ],
)  # fmt: skip
def test_a_sweep_with_a_failed_job_says_what_works_for_its_sweeper(
    tmp_path, capsys, sweeper, next_step, not_said
):
    sweep = tmp_path / "sweep"
    finished_trial(sweep, 0)
    failed_job(sweep, 1)
    cfg = compose_config(tmp_path, [*sweeper, f"hydra.sweep.dir={sweep}"])
    outcome = SweepOutcome()
    outcome.on_multirun_start(config=cfg)
    with pytest.raises(SystemExit) as ended:
        outcome.on_multirun_end(config=cfg)
    assert ended.value.code == 1
    message = capsys.readouterr().err
    assert "1 jobs of the sweep" in message and "job 1: ValueError: r must be > 0" in message
    assert next_step in message and not_said not in message
