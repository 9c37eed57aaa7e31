"""What ends a run with isoprobe's own message alone (:func:`isoprobe.tasks.exit_on_user_error`)."""

from __future__ import annotations


class IsoprobeError(Exception):
    """An input isoprobe refuses (a setting, a file, a directory): its message names the
    problem and the fix, so a run that raises it ends with that message and exit code 1, without
    a traceback (``HYDRA_FULL_ERROR=1`` shows one)."""
