"""The base of isoprobe's Hydra callbacks: an error in one ends the command, never a warning.

Hydra calls each callback's hook inside ``except Exception`` and turns what it raises into a
warning, then goes on (``hydra/_internal/callbacks.py``): a refusal would let the command run on
and a failed check would pass unseen. Every hook that a subclass of :class:`IsoprobeCallback`
defines is wrapped so that an exception ends the process with ``SystemExit``, which Hydra does
not catch: one of isoprobe's own errors (:mod:`isoprobe.tasks.user_errors`) with
``Error: <message>`` alone and exit code 1, any other (a bug, a library's) with its traceback
and exit code 1. ``HYDRA_FULL_ERROR=1`` shows the traceback of isoprobe's own errors too.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from hydra.experimental.callback import Callback

from isoprobe.tasks.user_errors import is_own_error, message

#: the hooks Hydra calls on a callback
HOOKS = (
    "on_run_start",
    "on_run_end",
    "on_multirun_start",
    "on_multirun_end",
    "on_job_start",
    "on_job_end",
)


def ends_the_process(hook: Callable[..., None]) -> Callable[..., None]:
    """``hook``, whose exceptions end the process (module docstring)."""

    @functools.wraps(hook)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as err:
            if is_own_error(err) and os.environ.get("HYDRA_FULL_ERROR") != "1":
                print(f"Error: {message(err)}", file=sys.stderr)
                raise SystemExit(1) from None
            traceback.print_exc()
            raise SystemExit(1) from err

    return wrapped


class IsoprobeCallback(Callback):
    """A Hydra callback whose hooks end the process on an error instead of warning."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in HOOKS:
            if name in vars(cls):
                setattr(cls, name, ends_the_process(vars(cls)[name]))
