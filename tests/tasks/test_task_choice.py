"""A task is chosen as a model is: ``configs/task/<name>.yaml`` names its Task with ``_target_``,
so a task of one's own is a Task in one's own module and a config that names it."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from isoprobe.tasks import run_task
from isoprobe.tasks.sweep_job import run_sweep_job
from isoprobe.tasks.task import Task, UnknownTaskError, known_tasks, task_of
from isoprobe.tasks.user_errors import exit_on_user_error
from tests.conftest import CONFIG_DIR, compose_config

SHIPPED = sorted(path.stem for path in (CONFIG_DIR / "task").glob("*.yaml"))


def echo(cfg: DictConfig) -> dict[str, str]:
    return {"said": cfg.task.words}


#: a task defined outside isoprobe, as a user's module would define it
ECHO = Task("echo", trains=False, alone=echo)
#: a user's task that trains, for the sweep's resume
TRAINS = Task("trains", trains=True, alone=echo)


def user_config_dir(root: Path) -> Path:
    """A user's config directory holding ``task/echo.yaml``, which names :data:`ECHO`."""
    (root / "task").mkdir(parents=True)
    (root / "task" / "echo.yaml").write_text(
        f"_target_: {__name__}.ECHO\nname: echo\nwords: hello\n"
    )
    return root


def test_every_shipped_task_config_names_its_task(tmp_path):
    assert SHIPPED == [
        "analyze",
        "compress",
        "embedding_spectra",
        "finetune",
        "pretrain",
        "probe",
    ]
    for name in SHIPPED:
        cfg = compose_config(tmp_path, [f"task={name}"])
        task = task_of(cfg)
        assert isinstance(task, Task) and task.name == name
        assert cfg.task._target_.startswith(f"isoprobe.tasks.{name}.")
    assert known_tasks() == SHIPPED


def test_a_users_task_runs_from_a_config_on_the_search_path_with_no_edit_in_isoprobe(tmp_path):
    configs = user_config_dir(tmp_path / "my_configs")
    cfg = compose_config(tmp_path, [f"hydra.searchpath=[file://{configs}]", "task=echo"])
    assert task_of(cfg) is ECHO
    assert known_tasks() == sorted([*SHIPPED, "echo"])
    assert run_task(cfg) == {"said": "hello"}


def test_a_users_task_runs_by_overriding_the_target(tmp_path):
    overrides = [f"task._target_={__name__}.ECHO", "task.name=echo", "+task.words=hi"]
    assert run_task(compose_config(tmp_path, overrides)) == {"said": "hi"}


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("tests.tasks.no_such_module.TASK", "cannot be imported (No module named"),
        (f"{__name__}.NO_SUCH_TASK", f"cannot be imported (module '{__name__}' has no"),
        ("isoprobe.tasks.probe.run_probe", "is a function, not a Task"),
        ("PROBE", "cannot be imported ('PROBE' is not of the form module.NAME)"),
    ],
)
def test_a_target_that_names_no_task_is_refused_with_the_known_tasks(tmp_path, target, problem):
    cfg = compose_config(tmp_path, [f"task._target_={target}"])
    with pytest.raises(UnknownTaskError) as refused:
        run_task(cfg)
    words = str(refused.value)
    assert f"task 'finetune' names no Task: task._target_='{target}' {problem}" in words
    assert f"Choose task= one of {', '.join(SHIPPED)}, or give" in words
    assert "docs/adding-a-task.md" in words


def test_a_task_config_without_target_ends_the_run_with_one_message(tmp_path, capsys):
    cfg = compose_config(tmp_path, ["~task._target_"])
    with pytest.raises(SystemExit) as ended, exit_on_user_error():
        run_task(cfg)
    assert ended.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: task 'finetune' names no Task: its config has no _target_.")
    assert "Traceback" not in err and len(err.splitlines()) == 1


def test_a_target_of_another_name_is_refused(tmp_path):
    cfg = compose_config(tmp_path, ["task=probe", "task._target_=isoprobe.tasks.finetune.FINETUNE"])
    with pytest.raises(UnknownTaskError, match="task.name='probe', but task._target_="):
        task_of(cfg)


@pytest.mark.parametrize(("task", "resumes"), [(ECHO, False), (TRAINS, True)])
def test_a_stopped_sweep_job_resumes_only_when_its_task_trains(tmp_path, task, resumes):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    cfg = OmegaConf.create(
        {
            "task": {"_target_": f"{__name__}.{task.name.upper()}", "name": task.name},
            "paths": {"output_dir": str(tmp_path)},
            "ckpt_path": None,
        }
    )
    seen = run_sweep_job(cfg, lambda job: {"ckpt_path": job.ckpt_path})
    expected = str(tmp_path / "checkpoints" / "last.ckpt") if resumes else None
    assert seen == {"ckpt_path": expected}
