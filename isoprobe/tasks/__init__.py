"""What ``run.py`` dispatches to: :func:`run_task` runs the :class:`~isoprobe.tasks.task.Task`
that the config ``configs/task/<name>.yaml`` names with ``_target_`` (``task=<name>``), one module
per task."""

from isoprobe.models.build import build_model
from isoprobe.tasks.runner import run_task
from isoprobe.tasks.task import Task
from isoprobe.tasks.user_errors import exit_on_user_error

__all__ = ["Task", "build_model", "exit_on_user_error", "run_task"]
