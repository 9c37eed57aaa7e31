"""A run that ends on an input isoprobe refuses shows isoprobe's message alone.

An error is isoprobe's own when it is an :class:`~isoprobe.errors.IsoprobeError`, or a
``ValueError``, ``KeyError`` or ``FileNotFoundError`` raised in isoprobe's own code (its
refusals of a setting or a file, each worded with the problem and the fix). Such a run prints
``Error: <message>`` on stderr and exits with code 1; ``HYDRA_FULL_ERROR=1`` shows the traceback
instead, as Hydra does for its own errors. Any other exception (a library's, a bug) keeps its
traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import isoprobe
from isoprobe.errors import IsoprobeError

#: the folder of isoprobe's own code
OWN_CODE = (Path(isoprobe.__file__).parent,)
#: the built-in errors isoprobe raises for inputs it refuses
REFUSALS = (ValueError, KeyError, FileNotFoundError)


def is_own_error(err: BaseException) -> bool:
    """Whether ``err`` is one of isoprobe's refusals (module docstring)."""
    if isinstance(err, IsoprobeError):
        return True
    if not isinstance(err, REFUSALS) or err.__traceback__ is None:
        return False
    innermost = err.__traceback__
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    where = Path(innermost.tb_frame.f_code.co_filename).resolve()
    return any(where.is_relative_to(root.resolve()) for root in OWN_CODE)


def message(err: BaseException) -> str:
    """The error's words (a ``KeyError``'s without the quotes its ``str`` adds)."""
    if isinstance(err, KeyError) and len(err.args) == 1:
        return str(err.args[0])
    return str(err)


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Around a run: isoprobe's own errors end it with their message and exit code 1."""
    try:
        yield
    except Exception as err:
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or not is_own_error(err):
            raise
        print(f"Error: {message(err)}", file=sys.stderr)
        raise SystemExit(1) from None
