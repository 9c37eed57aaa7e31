"""What a checkpoint must carry beyond Lightning's state so that a resumed run is the same run."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from isoprobe.models.checkpoints import CheckpointError

CHECKPOINT_KEY = "isoprobe_run"


class RunIdentity(Callback):
    """Stores the W&B run ids (and the resolved model checkpoint) in every Lightning checkpoint."""

    def __init__(self, wandb_ids: dict[str, Any], resolved_checkpoint: str) -> None:
        self.wandb_ids = dict(wandb_ids)
        self.resolved_checkpoint = resolved_checkpoint

    @override
    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "wandb_ids": self.wandb_ids,
            "resolved_checkpoint": self.resolved_checkpoint,
        }


def read_checkpoint(ckpt_path: str) -> dict[str, Any]:
    """A Lightning checkpoint read with ``weights_only=True``: tensors, containers and primitives
    only, so a checkpoint from elsewhere cannot run code while it is read (Lightning's own load
    in ``fit`` reads it the same way). Anything else gets an error that says what the file is."""
    hint = "Pass the last.ckpt of an earlier run (<run dir>/checkpoints/last.ckpt)."
    path = Path(ckpt_path)
    if path.is_dir():
        raise CheckpointError(f"ckpt_path={ckpt_path!r} is a directory, not a checkpoint. {hint}")
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path={ckpt_path!r} does not exist. {hint}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if refused:
            raise CheckpointError(
                f"ckpt_path={ckpt_path} holds Python objects other than tensors and plain "
                f"containers ({refused.group(1)}), which are refused because reading them "
                f"could run code. {hint}"
            ) from err
        raise CheckpointError(f"ckpt_path={ckpt_path} is not a PyTorch checkpoint. {hint}") from err
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(
            f"ckpt_path={ckpt_path} is not a readable PyTorch checkpoint ({err}). {hint}"
        ) from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"ckpt_path={ckpt_path} is not a Lightning checkpoint. {hint}")
    return checkpoint


def check_resume_checkpoint(ckpt_path: str | None, model: LightningModule) -> dict[str, Any]:
    """Validate a checkpoint to resume against ``model`` and return the run identity it carries.

    Fails before any training with an error naming the mismatching parameters, instead of
    Lightning's size-mismatch trace from deep inside ``fit``.
    """
    if ckpt_path is None:
        return {}
    checkpoint = read_checkpoint(ckpt_path)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in checkpoint["state_dict"].items()}
    missing = sorted(expected.keys() - found.keys())
    unexpected = sorted(found.keys() - expected.keys())
    resized = sorted(k for k in expected.keys() & found.keys() if expected[k] != found[k])
    if missing or unexpected or resized:
        details = [f"{k}: checkpoint {found[k]} vs model {expected[k]}" for k in resized[:5]]
        details += [f"missing {k}" for k in missing[:5]] + [
            f"unexpected {k}" for k in unexpected[:5]
        ]
        raise CheckpointError(
            f"ckpt_path={ckpt_path} does not match this model's architecture "
            f"({len(resized)} resized, {len(missing)} missing, {len(unexpected)} unexpected "
            f"parameters; e.g. {'; '.join(details)}). Resume with the same model config "
            "(and model.checkpoint) as the run that wrote it."
        )
    return checkpoint.get(CHECKPOINT_KEY, {})
