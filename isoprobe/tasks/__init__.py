"""What ``run.py`` dispatches to: finetune | probe | pretrain."""

from isoprobe.tasks.runner import TASKS, build_model, run_task

__all__ = ["TASKS", "build_model", "run_task"]
