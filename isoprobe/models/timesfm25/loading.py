"""Where a TimesFM 2.5 network's weights come from: a scratch shape (``model.sizes``), or a
checkpoint directory / hub id holding model.safetensors (the published layout of
google/timesfm-2.5-200m-pytorch) beside a config.json.

Only data is read: config.json with :func:`json.loads` (:func:`.config.shape_from_config` says
which shape it gives), the weights with safetensors; no pickle, no code. Every tensor the shape
needs must be there with its shape, and nothing else; weights of another dtype become float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from isoprobe.models.checkpoints import (
    CheckpointError,
    ResolvedCheckpoint,
    checkpoint_file,
    read_json_config,
    read_safetensors,
    scratch_shape,
)
from isoprobe.models.timesfm25.config import LOADS, shape_from_config, shape_from_fields
from isoprobe.models.timesfm25.network import TimesFm25Network, isoprobe_name

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def load_network(
    resolved: ResolvedCheckpoint,
    scratch: Mapping[str, Any] | None,
    published: Mapping[str, Any],
) -> TimesFm25Network:
    """The network of ``model.checkpoint`` in train mode: ``scratch`` builds the scratch
    fields; a checkpoint builds its config.json's shape, or ``published`` (the published
    shape) for a config.json that describes none, and loads its weights."""
    if resolved.kind == "scratch":
        return TimesFm25Network(shape_from_fields(scratch_shape(scratch), "model.sizes"))
    source = resolved.location
    config = read_json_config(checkpoint_file(resolved, CONFIG_NAME))
    shape, where = shape_from_config(config, published, source)
    network = TimesFm25Network(shape)
    published_weights = read_safetensors(checkpoint_file(resolved, WEIGHTS_NAME))
    weights = {isoprobe_name(name): tensor for name, tensor in published_weights.items()}
    _check_fit(weights, network.state_dict(), f"the weights in {source}", where)
    not_floats = sorted(name for name, tensor in weights.items() if not tensor.is_floating_point())
    if not_floats:
        raise CheckpointError(
            f"the weights in {source} hold tensors that are not floating point ({not_floats[:3]}"
            f"). {LOADS}"
        )
    network.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return network.train()


def _check_fit(
    weights: Mapping[str, Tensor], expected: Mapping[str, Tensor], what: str, where: str
) -> None:
    """Refuse, in one message, weights that are not exactly the tensors of the shape built
    from ``where``: the first misshapen tensor with both shapes, else the missing and the
    unexpected ones."""
    mismatched = [
        (name, tuple(weights[name].shape), tuple(tensor.shape))
        for name, tensor in expected.items()
        if name in weights and weights[name].shape != tensor.shape
    ]
    if mismatched:
        name, found, wanted = mismatched[0]
        raise CheckpointError(
            f"{what} do not fit the TimesFM 2.5 shape of {where}: {name} has shape {found} in "
            f"the checkpoint but {wanted} in the model ({len(mismatched)} tensors differ). "
            f"{LOADS}"
        )
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{what} do not match the TimesFM 2.5 shape of {where}: {len(missing)} weights "
            f"missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. "
            f"{unexpected[:3]}). {LOADS}"
        )
