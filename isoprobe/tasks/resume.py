"""What a checkpoint must carry beyond Lightning's state so that a resumed run is the same run."""

from __future__ import annotations

import json
import logging
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.pickle_globals import refused_globals

log = logging.getLogger(__name__)

CHECKPOINT_KEY = "isoprobe_run"


#: the data settings that define the windows (and so the probe set) of a run
DATA_IDENTITY_KEYS = (
    "dataset",
    "dataset_kwargs",
    "context_length",
    "prediction_length",
    "split",
    "eval_stride",
    "max_eval_windows",
    "scaling",
    "noise_std",
    "nan_policy",
)


def data_identity(datamodule: Any) -> dict[str, Any]:
    """The settings of ``DATA_IDENTITY_KEYS`` as plain values (lists, not tuples)."""
    return json.loads(json.dumps({key: getattr(datamodule, key) for key in DATA_IDENTITY_KEYS}))


def rng_states() -> dict[str, Any]:
    """The global torch (CPU and initialised CUDA), numpy and Python random states, in types
    that a ``weights_only`` load accepts."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what :func:`rng_states` returned."""
    torch.set_rng_state(states["torch"])
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RunIdentity(Callback):
    """Stores in every Lightning checkpoint what Lightning's own state lacks for a resumed run to
    be the same run: the W&B run ids, the resolved model checkpoint, the data settings that
    define the windows, and the random states, which are restored when training resumes so that
    the resumed run draws the same batches and dropout masks as an uninterrupted one. It also
    stores where every part of each W&B run so far keeps its local log (``wandb_dirs``: config
    name -> save dirs), so that a resumed part continues after what they logged; the adaptation
    strategy (``adapt``: ``model.adapt``), which a resumed run may not change; and the zero-shot
    forecast metrics of the run's start (``before``: the first part's ``trainer.test``), which a
    resumed part reports as its own start, having no untrained model to forecast with."""

    def __init__(
        self,
        wandb_ids: dict[str, Any],
        resolved_checkpoint: str,
        data: dict[str, Any],
        wandb_dirs: dict[str, list[str]] | None = None,
        adapt: str = "full",
        before: dict[str, float] | None = None,
    ) -> None:
        self.wandb_ids = dict(wandb_ids)
        self.wandb_dirs = dict(wandb_dirs or {})
        self.resolved_checkpoint = resolved_checkpoint
        self.data = data
        self.adapt = adapt
        self.before = before
        self._rng_to_restore: dict[str, Any] | None = None

    @override
    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "wandb_ids": self.wandb_ids,
            "wandb_dirs": self.wandb_dirs,
            "resolved_checkpoint": self.resolved_checkpoint,
            "data": self.data,
            "adapt": self.adapt,
            "before": self.before,
            "rng": rng_states(),
        }

    @override
    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self._rng_to_restore = checkpoint.get(CHECKPOINT_KEY, {}).get("rng")

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # here, not at load: the uninterrupted run drew nothing between saving the checkpoint
        # and the next epoch's first draw, which comes right after this hook
        if self._rng_to_restore is not None:
            set_rng_states(self._rng_to_restore)
            self._rng_to_restore = None


def check_same_data(identity: dict[str, Any], current: dict[str, Any], allow: bool) -> None:
    """Refuse to resume on other data than the checkpoint's run (the trajectory would join two
    probe sets) unless ``allow`` (``resume_allow_data_change=true``) says it is meant."""
    saved = identity.get("data")
    if saved is None:
        return
    changed = {
        key: (saved.get(key), current[key]) for key in current if saved.get(key) != current[key]
    }
    if changed and not allow:
        details = "; ".join(f"data.{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise CheckpointError(
            f"the checkpoint was trained on other data than this run's ({details}): its probe "
            "trajectory would join two different probe sets. Resume with the same data "
            "settings, or set resume_allow_data_change=true if that is what you want."
        )
    if changed:
        log.warning("resuming on changed data settings: %s", changed)


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
        refused = refused_globals(err, path)
        if refused:
            raise CheckpointError(
                f"ckpt_path={ckpt_path} pickles {', '.join(refused)}: a checkpoint to resume "
                "holds tensors and plain containers only, and other Python objects are refused "
                f"because reading them could run code. {hint}"
            ) from err
        raise CheckpointError(
            f"ckpt_path={ckpt_path} is not a PyTorch checkpoint that can be read safely "
            f"({_unpickling_reason(err)}). {hint}"
        ) from err
    except (RuntimeError, EOFError, OSError) as err:
        raise CheckpointError(
            f"ckpt_path={ckpt_path} is not a readable PyTorch checkpoint ({err}). {hint}"
        ) from err
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(f"ckpt_path={ckpt_path} is not a Lightning checkpoint. {hint}")
    if not _is_run_record(checkpoint.get(CHECKPOINT_KEY, {})):
        raise CheckpointError(
            f"ckpt_path={ckpt_path} holds a damaged {CHECKPOINT_KEY} record (a mapping whose "
            f"'before' maps metric names to numbers). {hint}"
        )
    return checkpoint


def _is_run_record(record: Any) -> bool:
    """Whether ``record`` has the shape :class:`RunIdentity` saves, as far as a resumed run
    reports it (``before``: metric name -> number, or none)."""
    if not isinstance(record, dict):
        return False
    before = record.get("before")
    return before is None or (
        isinstance(before, dict)
        and all(isinstance(k, str) and isinstance(v, (int, float)) for k, v in before.items())
    )


def _unpickling_reason(err: pickle.UnpicklingError) -> str:
    """The line of torch's weights-only error that says what stopped it (its other lines are
    advice to load with ``weights_only=False``, which isoprobe never does)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    reasons = [line for line in lines if line.startswith(("Unsupported", "Trying", "Can only"))]
    return (reasons or lines or ["unreadable pickle"])[0]


def check_resume_checkpoint(
    ckpt_path: str | None, model: LightningModule, adapt: str | None = None
) -> dict[str, Any]:
    """Validate a checkpoint to resume against ``model`` and return the run identity it carries.

    Fails before any training with an error naming the mismatching parameters, instead of
    Lightning's size-mismatch trace from deep inside ``fit``; with ``adapt`` (``model.adapt`` of
    a run that trains on), also when the checkpoint was trained with another strategy.
    """
    if ckpt_path is None:
        return {}
    checkpoint = read_checkpoint(ckpt_path)
    if adapt is not None:
        check_same_strategy(ckpt_path, checkpoint, adapt)
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
            "(model.checkpoint, model.adapt) as the run that wrote it."
        )
    return checkpoint.get(CHECKPOINT_KEY, {})


def check_same_strategy(ckpt_path: str, checkpoint: dict[str, Any], adapt: str) -> None:
    """Refuse to train on from a checkpoint with another ``model.adapt`` than the one it was
    trained with: the trajectory would switch strategy mid-run. The strategy is the one the
    checkpoint records; one written before it was recorded is known to be LoRA by its adapters
    (else it is not checked here)."""
    saved = checkpoint.get(CHECKPOINT_KEY, {}).get("adapt")
    if saved is None and any(".lora_" in key for key in checkpoint["state_dict"]):
        saved = "lora"
    if saved is not None and saved != adapt:
        raise CheckpointError(
            f"ckpt_path={ckpt_path} was trained with model.adapt={saved}, but this run asks for "
            f"model.adapt={adapt}: resuming would switch strategy mid-run. Resume with "
            f"model.adapt={saved}, or start a new run (without ckpt_path) to train with "
            f"model.adapt={adapt}."
        )
