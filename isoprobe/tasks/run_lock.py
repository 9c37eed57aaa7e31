"""One live run per run directory: a lock file in the directory, held for the whole run.

The lock is ``<run dir>/run.lock``. Its holder keeps an exclusive ``flock`` on it (the kernel
drops that lock when the process ends, however it ends) and writes into it who it is: pid,
host, start time and command. A second run in the same directory is refused with the first
one's pid and host. A lock file whose holder has ended (released normally, or the process was
killed) is taken over with a warning, so that resuming in place (``hydra.run.dir=<the same
run> ckpt_path=...``) works after the first run stopped. A lock written on another host cannot
be checked from here (its flock may not be visible across a network file system): it is
refused, and the message says to delete the file if that run is no longer running.

Under DDP only the launching process (global rank zero) takes the lock: Lightning's
subprocess launcher re-executes the command for the other ranks, with ``LOCAL_RANK`` set.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isoprobe.errors import IsoprobeError

log = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
#: environment variables through which launchers give a process its rank (any non-zero one
#: means this is not the launching process)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")


class RunDirectoryInUse(IsoprobeError, RuntimeError):
    """Another live run holds the run directory."""


@dataclass
class _Held:
    fd: int
    depth: int


#: lock path -> this process's hold on it (re-entrant: a nested hold of the same dir is free)
_HELD: dict[Path, _Held] = {}


def is_launching_process() -> bool:
    """Whether this process is global rank zero, or runs without any launcher's rank."""
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def _owner() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv),
    }


def _read_owner(fd: int) -> dict[str, Any] | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 65536).decode(errors="replace")
    try:
        owner = json.loads(text)
    except json.JSONDecodeError:
        return None
    return owner if isinstance(owner, dict) else None


def _describe(owner: dict[str, Any] | None) -> str:
    if owner is None:
        return "an unknown process"
    return (
        f"pid {owner.get('pid')} on host {owner.get('host')} (started {owner.get('started')}: "
        f"{owner.get('command', '?')})"
    )


def _refuse(path: Path, owner: dict[str, Any] | None, why: str) -> RunDirectoryInUse:
    return RunDirectoryInUse(
        f"the run directory {path.parent} is in use by {_describe(owner)}: {why}. Two runs in "
        f"one directory would overwrite each other's checkpoints and probe records. Give this "
        f"run its own directory (leave hydra.run.dir at its default, or set another one); to "
        f"resume that run in place, wait until it has ended. If it is no longer running, "
        f"delete {path}."
    )


def _open_locked(path: Path) -> int:
    """A descriptor of ``path`` holding its exclusive flock, the file still at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise _refuse(path, owner, "that run is still running") from None
        try:
            same_file = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            return fd
        os.close(fd)  # its holder released (deleted) it between our open and our flock


def _take(path: Path) -> int:
    fd = _open_locked(path)
    previous = _read_owner(fd)
    if previous is not None:
        if previous.get("host") != socket.gethostname():
            os.close(fd)
            raise _refuse(
                path,
                previous,
                "its lock was taken on another host, where this run "
                "cannot check whether it is still running",
            )
        log.warning(
            "run directory %s: taking over the lock of %s, which is no longer running",
            path.parent,
            _describe(previous),
        )
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(_owner()).encode())
    os.fsync(fd)
    return fd


def _release(path: Path, fd: int) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    finally:
        os.close(fd)


@contextmanager
def run_directory_lock(run_dir: str | Path) -> Iterator[Path | None]:
    """Hold ``<run_dir>/run.lock`` while the block runs (see the module docstring); yields the
    lock's path, or None in a process that is not the launching one (DDP's other ranks)."""
    if not is_launching_process():
        yield None
        return
    directory = Path(run_dir).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LOCK_NAME
    held = _HELD.get(path)
    if held is None:
        held = _HELD[path] = _Held(_take(path), 0)
    held.depth += 1
    try:
        yield path
    finally:
        held.depth -= 1
        if held.depth == 0:
            del _HELD[path]
            _release(path, held.fd)
