"""What ``run.py`` dispatches to: one module per task, each a :class:`~isoprobe.tasks.task.Task`
in :data:`TASKS` (``task=<name>``), run by :func:`run_task`."""

from isoprobe.models.build import build_model
from isoprobe.tasks.analyze import ANALYZE
from isoprobe.tasks.compress import COMPRESS
from isoprobe.tasks.embedding_spectra import EMBEDDING_SPECTRA
from isoprobe.tasks.finetune import FINETUNE
from isoprobe.tasks.pretrain import PRETRAIN
from isoprobe.tasks.probe import PROBE
from isoprobe.tasks.runner import run_task
from isoprobe.tasks.task import Task
from isoprobe.tasks.user_errors import exit_on_user_error

#: ``task=<name>`` -> what it runs
TASKS: dict[str, Task] = {
    t.name: t for t in (FINETUNE, PROBE, PRETRAIN, COMPRESS, ANALYZE, EMBEDDING_SPECTRA)
}

__all__ = ["TASKS", "Task", "build_model", "exit_on_user_error", "run_task"]
