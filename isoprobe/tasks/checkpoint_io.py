"""Checkpoints written atomically and durably, and a failed write that says what to do.

:class:`AtomicCheckpointIO` (``configs/trainer/default.yaml``: ``plugins``) writes every
checkpoint of a local path to a hidden temporary file beside it, flushes it to the disk and
renames it over the final name, so a checkpoint file is either complete or absent: a full disk
or a killed process never leaves a truncated ``epoch_001.ckpt`` that a resume would trip on.
A write that fails removes its temporary file and raises :class:`CheckpointWriteError`, naming
the checkpoint, the reason and the space left on its file system.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from isoprobe.errors import IsoprobeError


class CheckpointWriteError(IsoprobeError, OSError):
    """A checkpoint could not be written (the previous checkpoints are untouched)."""


def free_space(directory: Path) -> str:
    """The space left on the file system of ``directory``, in words."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return "unknown free space"
    return f"{free / 2**20:.1f} MiB free"


def write_file_durably(path: Path, data: bytes) -> None:
    """``data`` into ``path`` (created or truncated), flushed to the disk."""
    with path.open("wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _is_local(path: Any) -> bool:
    protocol = get_filesystem(path).protocol
    return "file" in ((protocol,) if isinstance(protocol, str) else protocol)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO, written through a temporary file and a rename."""

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)  # object stores
            return
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        temporary = target.with_name(f".{target.name}.tmp")
        try:
            write_file_durably(temporary, buffer.getbuffer())
            os.replace(temporary, target)
        except OSError as err:
            temporary.unlink(missing_ok=True)
            raise CheckpointWriteError(
                err.errno,
                f"could not write the checkpoint {target} ({len(buffer.getbuffer()) / 2**20:.1f} "
                f"MiB): {err.strerror or err}; {free_space(target.parent)} on its file system. "
                "Nothing was written under that name and the earlier checkpoints are intact: "
                "free some space (or keep fewer checkpoints: "
                "callbacks.model_checkpoint.save_top_k) and resume with ckpt_path=<the last "
                "checkpoint written>.",
            ) from err
