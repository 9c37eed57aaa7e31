"""What ``run.py`` dispatches to: finetune | probe | pretrain | compress | analyze |
embedding_spectra."""

from isoprobe.tasks.runner import TASKS, build_model, run_task
from isoprobe.tasks.user_errors import exit_on_user_error

__all__ = ["TASKS", "build_model", "exit_on_user_error", "run_task"]
