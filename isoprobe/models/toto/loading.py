"""Where a Toto network's weights come from: a scratch shape (``model.sizes``), or a checkpoint
directory / hub id holding config.json and model.safetensors, the published layout of
Datadog/Toto-Open-Base-1.0.

Only data is read: config.json with :func:`json.loads` (its keys are the official
constructor's, :func:`.config.shape_from_fields` checks them), the weights with safetensors; no
pickle, no code. Every tensor the shape needs must be there with its shape, and nothing else
(the published names, fused or unfused SwiGLU; the recomputed rotary buffer is ignored);
weights of another dtype become float32.
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
from isoprobe.models.toto.config import LOADS, shape_from_fields
from isoprobe.models.toto.network import TotoNetwork, isoprobe_names

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> TotoNetwork:
    """The network of ``model.checkpoint`` in train mode: ``scratch`` builds the scratch
    fields; a checkpoint builds its config.json's shape and loads its weights."""
    if resolved.kind == "scratch":
        return TotoNetwork(shape_from_fields(scratch_shape(scratch), "model.sizes"))
    source = resolved.location
    config = read_json_config(checkpoint_file(resolved, CONFIG_NAME))
    shape = shape_from_fields(config, f"{source}/config.json")
    network = TotoNetwork(shape)
    weights = isoprobe_names(read_safetensors(checkpoint_file(resolved, WEIGHTS_NAME)), shape)
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
    """Refuse, in one message, weights that are not exactly the tensors of the architecture
    ``source``'s config.json describes: the first misshapen tensor with both shapes, else the
    missing and the unexpected ones."""
    mismatched = [
        (name, tuple(weights[name].shape), tuple(tensor.shape))
        for name, tensor in expected.items()
        if name in weights and weights[name].shape != tensor.shape
    ]
    if mismatched:
        name, found, wanted = mismatched[0]
        raise CheckpointError(
            f"the weights in {source} do not fit the Toto its config.json describes: {name} has "
            f"shape {found} in the checkpoint but {wanted} in the model ({len(mismatched)} "
            f"tensors differ). The config was edited or belongs to other weights. {LOADS}"
        )
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"the weights in {source} do not match the Toto its config.json describes: "
            f"{len(missing)} weights missing (e.g. {missing[:3]}), {len(unexpected)} unexpected "
            f"(e.g. {unexpected[:3]}). The config was edited or belongs to other weights. {LOADS}"
        )
