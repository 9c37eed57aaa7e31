"""A checkpoint to resume is read without running code from it, and bad paths say what they are."""

from __future__ import annotations

import pathlib

import pytest
import torch
from torch import nn

from isoprobe.models.adaptation import ADAPT_CHOICES
from isoprobe.models.checkpoints import CheckpointError
from isoprobe.tasks.resume import CHECKPOINT_KEY, check_resume_checkpoint, read_checkpoint


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


PAIRS = [(saved, asked) for saved in ADAPT_CHOICES for asked in ADAPT_CHOICES if saved != asked]


@pytest.mark.parametrize("saved, asked", PAIRS)
def test_resuming_with_another_strategy_is_refused_naming_both(tmp_path, saved, asked):
    """The strategy is checked before the architecture: a frozen_backbone checkpoint has the
    same tensors as a full one, and is refused all the same."""
    path, model = tmp_path / "last.ckpt", nn.Linear(2, 2)
    torch.save({"state_dict": model.state_dict(), CHECKPOINT_KEY: {"adapt": saved}}, path)
    expected = rf"was trained with model\.adapt={saved}, but this run asks for model\.adapt={asked}"
    with pytest.raises(CheckpointError, match=expected):
        check_resume_checkpoint(str(path), model, asked)
    assert check_resume_checkpoint(str(path), model, saved) == {"adapt": saved}
    assert check_resume_checkpoint(str(path), model) == {"adapt": saved}  # task=probe: no check


def test_a_lora_checkpoint_that_records_no_strategy_is_known_by_its_adapters(tmp_path):
    path = tmp_path / "last.ckpt"
    state = {"q.base_layer.weight": torch.ones(2, 2), "q.lora_A.default.weight": torch.ones(1, 2)}
    torch.save({"state_dict": state}, path)
    with pytest.raises(CheckpointError, match=r"model\.adapt=lora, but .* model\.adapt=full"):
        check_resume_checkpoint(str(path), nn.Linear(2, 2), "full")


@pytest.mark.parametrize(
    "record", [["not", "a", "mapping"], {"before": "0.3"}, {"before": {"test/nmse": "x"}}]
)
def test_a_damaged_run_record_is_named(tmp_path, record):
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, CHECKPOINT_KEY: record}, path)
    with pytest.raises(CheckpointError, match=f"damaged {CHECKPOINT_KEY} record"):
        read_checkpoint(str(path))
