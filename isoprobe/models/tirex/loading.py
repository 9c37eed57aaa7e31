"""Where a TiRex network's weights come from: a scratch shape (``model.sizes``), an isoprobe
export or the bundled mini (config.json + model.safetensors), or the published checkpoint
(NX-AI/TiRex's ``model.ckpt``, a Lightning checkpoint: a hub id, the file, or a directory holding
it and no config.json).

Only data is read. config.json with :func:`json.loads`, safetensors as such. The published
``model.ckpt`` is a pickle; it is read by an allow-list unpickler (the standard library's
"restricting globals" recipe, :mod:`isoprobe.models.allow_list_pickle`) that rebuilds tensors
and plain containers and refuses any other global by name before anything of it runs: the
package itself reads it with ``weights_only=True``, so it holds nothing else. Every tensor the
shape needs must be there with its shape, and nothing else; other dtypes become float32.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from isoprobe.models.allow_list_pickle import TENSOR_GLOBALS, allow_list_pickle
from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    checkpoint_file,
    load_float_weights,
    read_json_config,
    read_safetensors,
    scratch_shape,
)
from isoprobe.models.tirex.config import (
    LOADS,
    TirexShape,
    shape_from_config,
    shape_from_fields,
    shape_from_hyperparameters,
)
from isoprobe.models.tirex.network import TirexNetwork, isoprobe_name

CONFIG_NAME, WEIGHTS_NAME, PUBLISHED_NAME = "config.json", "model.safetensors", "model.ckpt"

#: what the published checkpoint's pickle may name: tensors and containers, nothing else
checkpoint_pickle = allow_list_pickle(
    TENSOR_GLOBALS, lambda module, name: False, "the TiRex checkpoint"
)


def published_file(checkpoint: str) -> Path | None:
    """The published ``model.ckpt`` that ``model.checkpoint`` names, or None: the file itself,
    or a directory holding it and no config.json (a download of NX-AI/TiRex)."""
    path = Path(checkpoint).expanduser()
    if path.suffix == ".ckpt" and path.is_file():
        return path.resolve()
    if (path / PUBLISHED_NAME).is_file() and not (path / CONFIG_NAME).is_file():
        return (path / PUBLISHED_NAME).resolve()
    return None


def read_published(path: Path) -> tuple[TirexShape, dict[str, Tensor]]:
    """The shape (its ``hyper_parameters``) and the weights (its ``state_dict``, isoprobe's
    names) of a published Lightning checkpoint, read through the allow-list."""
    try:
        checkpoint = torch.load(
            path, map_location="cpu", pickle_module=checkpoint_pickle, weights_only=False
        )
    except (pickle.UnpicklingError, AttributeError, TypeError, EOFError, RuntimeError) as err:
        raise CheckpointError(
            f"{path} cannot be loaded safely ({err}): it holds more than tensors and plain "
            f"containers, which are refused on purpose. {LOADS}"
        ) from err
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(f"{path} is not a Lightning checkpoint with a state_dict. {LOADS}")
    shape = shape_from_hyperparameters(checkpoint.get("hyper_parameters"), str(path))
    weights = {isoprobe_name(k): v for k, v in checkpoint["state_dict"].items()}
    return shape, weights


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> TirexNetwork:
    """The network of ``model.checkpoint`` in train mode (module docstring)."""
    if resolved.kind == "scratch":
        return TirexNetwork(shape_from_fields(scratch_shape(scratch), "model.sizes"))
    source = resolved.location
    if resolved.kind == "hub":
        shape, weights = read_published(checkpoint_file(resolved, PUBLISHED_NAME))
    elif published_file(source) is not None:
        shape, weights = read_published(Path(source))
    else:
        config = read_json_config(Path(source) / CONFIG_NAME)
        shape = shape_from_config(config, source)
        published = read_safetensors(Path(source) / WEIGHTS_NAME)
        weights = {isoprobe_name(name): tensor for name, tensor in published.items()}
    described = "the TiRex architecture its configuration describes"
    return load_float_weights(TirexNetwork(shape), weights, source, described, LOADS)
