"""Where a Moirai 2.0 network's weights come from: a scratch shape (``model.sizes``), or a
checkpoint directory / hub id holding the published layout of Salesforce/moirai-2.0-R-small:
config.json (``Moirai2Module``'s arguments) beside model.safetensors.

Only data is read: config.json with :func:`json.loads` (checked by
:func:`.config.shape_from_fields`), the weights with safetensors; no pickle, no code. Every
tensor the shape needs must be there with its shape, and nothing else; weights of another
dtype become float32.
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
from isoprobe.models.moirai2.config import LOADS, shape_from_fields
from isoprobe.models.moirai2.network import Moirai2Network

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> Moirai2Network:
    """The network of ``model.checkpoint`` in train mode: ``scratch`` builds the scratch
    fields; a checkpoint builds its config.json's shape and loads its weights."""
    if resolved.kind == "scratch":
        return Moirai2Network(shape_from_fields(scratch_shape(scratch), "model.sizes"))
    source = resolved.location
    config = read_json_config(checkpoint_file(resolved, CONFIG_NAME))
    network = Moirai2Network(shape_from_fields(config, f"{source}/config.json"))
    weights = read_safetensors(checkpoint_file(resolved, WEIGHTS_NAME))
    _check_fit(weights, network.state_dict(), source)
    not_floats = sorted(name for name, tensor in weights.items() if not tensor.is_floating_point())
    if not_floats:
        raise CheckpointError(
            f"the weights in {source} hold tensors that are not floating point ({not_floats[:3]}"
            f"). {LOADS}"
        )
    network.load_state_dict({name: tensor.float() for name, tensor in weights.items()})
    return network.train()


def _check_fit(weights: Mapping[str, Tensor], expected: Mapping[str, Tensor], source: str) -> None:
    """Refuse, in one message, weights that are not exactly the tensors of the shape
    config.json describes: the first misshapen tensor with both shapes, else the missing and
    the unexpected ones."""
    what = f"the weights in {source}"
    mismatched = [
        (name, tuple(weights[name].shape), tuple(tensor.shape))
        for name, tensor in expected.items()
        if name in weights and weights[name].shape != tensor.shape
    ]
    if mismatched:
        name, found, wanted = mismatched[0]
        raise CheckpointError(
            f"{what} do not fit the Moirai 2.0 shape of its config.json: {name} has shape "
            f"{found} in the checkpoint but {wanted} in the model ({len(mismatched)} tensors "
            f"differ). {LOADS}"
        )
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{what} do not match the Moirai 2.0 shape of its config.json: {len(missing)} "
            f"weights missing (e.g. {missing[:3]}), {len(unexpected)} unexpected (e.g. "
            f"{unexpected[:3]}). {LOADS}"
        )
