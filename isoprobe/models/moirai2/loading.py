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

from isoprobe.models.checkpoints import (
    ResolvedCheckpoint,
    checkpoint_file,
    load_float_weights,
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
    return load_float_weights(
        network, weights, source, "the Moirai 2.0 shape of its config.json", LOADS
    )
