"""A checkpoint to resume is read without running code from it, and bad paths say what they are."""

from __future__ import annotations

import pathlib

import pytest
import torch

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.tasks.resume import read_checkpoint


class _TouchOnLoad:
    """Unpickling this calls Path.touch: what a hostile checkpoint could do instead."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "hostile.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "payload": _TouchOnLoad(marker)}, path)
    with pytest.raises(CheckpointError, match="refused because reading them could run code"):
        read_checkpoint(str(path))
    assert not marker.exists()
    assert path.is_file()  # the file is left as it was


def test_a_plain_lightning_checkpoint_reads(tmp_path):
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.ones(3)}, "epoch": 2, "loops": {"a": [1, 2.5]}}, path)
    checkpoint = read_checkpoint(str(path))
    assert checkpoint["epoch"] == 2 and torch.equal(checkpoint["state_dict"]["w"], torch.ones(3))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.mkdir(), "is a directory, not a checkpoint"),
        (lambda p: p.write_text("not a checkpoint\n"), "is not a PyTorch checkpoint"),
        (lambda p: torch.save({"w": torch.ones(1)}, p), "is not a Lightning checkpoint"),
        (lambda p: None, "does not exist"),
    ],
)
def test_what_is_not_a_checkpoint_is_named(tmp_path, make, message):
    path = tmp_path / "last.ckpt"
    make(path)
    with pytest.raises((CheckpointError, FileNotFoundError), match=message):
        read_checkpoint(str(path))
