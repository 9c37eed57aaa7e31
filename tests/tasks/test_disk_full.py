"""A disk that fills up mid-run: checkpoints are complete or absent, the error names the file
and the free space, and the resumed run leaves W&B with every probed epoch once and a step
that never goes backwards."""

from __future__ import annotations

import errno
from pathlib import Path

import pandas as pd
import pytest
import torch

from isoprobe.tasks import checkpoint_io, run_task
from isoprobe.tasks.checkpoint_io import AtomicCheckpointIO, CheckpointWriteError
from tests.conftest import TINY, compose_config, wandb_home_env, wandb_records


def _disk_full_at(monkeypatch, name: str) -> None:
    """Writing the checkpoint ``name`` gets half its bytes onto the disk, then ENOSPC."""
    write = checkpoint_io.write_file_durably

    def write_until_full(path: Path, data) -> None:
        if path.name != f".{name}.tmp":
            return write(path, data)
        path.write_bytes(bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_io, "write_file_durably", write_until_full)


def test_a_failed_checkpoint_write_leaves_no_file_and_keeps_the_earlier_one(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    target = tmp_path / "last.ckpt"
    io.save_checkpoint({"state": torch.arange(4)}, target)
    _disk_full_at(monkeypatch, "last.ckpt")
    with pytest.raises(CheckpointWriteError, match=rf"{target} .*No space left.* MiB free") as err:
        io.save_checkpoint({"state": torch.arange(1000)}, target)
    assert err.value.errno == errno.ENOSPC
    assert torch.equal(torch.load(target, weights_only=True)["state"], torch.arange(4))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def _wandb_parts(run_dir: Path) -> list[list[dict]]:
    """The history rows of every local part of the run's W&B run, in the order they ran."""
    parts = sorted((run_dir / "wandb").glob("offline-run-*"))
    return [
        [r["history"]["item"] for r in wandb_records(part) if r["type"] == "history"]
        for part in parts
    ]


@pytest.mark.slow
def test_a_run_stopped_by_a_full_disk_resumes_with_each_probed_epoch_once_in_wandb(
    tmp_path, monkeypatch
):
    for variable, value in wandb_home_env(tmp_path).items():
        monkeypatch.setenv(variable, value)
    base = [*TINY, "logger=wandb", "model.checkpoint=scratch", "trainer.max_epochs=2"]
    base += ["task.evaluate_before=false", "task.evaluate_after=false"]
    run_dir = tmp_path / "run"
    _disk_full_at(monkeypatch, "epoch_001.ckpt")
    with pytest.raises(CheckpointWriteError, match=r"epoch_001\.ckpt .*No space left on device"):
        run_task(compose_config(run_dir, base))
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["epoch_000.ckpt", "last.ckpt"]
    monkeypatch.undo()
    for variable, value in wandb_home_env(tmp_path).items():
        monkeypatch.setenv(variable, value)

    # resumed in place from the last complete checkpoint: epoch 2 is probed again
    run_task(compose_config(run_dir, [*base, f"ckpt_path={checkpoints / 'last.ckpt'}"]))
    records = pd.read_csv(run_dir / "probe_metrics.csv")
    assert sorted(records.epoch.unique()) == [0, 1, 2]
    assert not records.duplicated(["epoch", "layer", "metric"]).any()

    killed, resumed = _wandb_parts(run_dir)
    probed = [h["probe/epoch"] for h in killed + resumed if "probe/cos_inter/embed" in h]
    assert probed == [0, 1, 2]
    assert [
        h["rank/epoch"] for h in killed + resumed if "rank/rank_uncentred_eps0.01/embed" in h
    ] == [
        0,
        1,
        2,
    ]
    steps = [h["_step"] for h in killed + resumed]
    assert steps == sorted(set(steps))  # strictly increasing across the resume
