"""Where a Sundial network's weights come from: a scratch shape (``model.sizes``), or a
checkpoint directory / hub id holding config.json and model.safetensors, the published layout
of thuml/sundial-base-128m.

Only data is read: config.json with :func:`json.loads` (its ``auto_map`` names Python files that
are never imported; :func:`.config.shape_from_fields` checks its keys), the weights with
safetensors; no pickle, no code. Every tensor the shape needs must be there with its shape, and
nothing else; weights of another dtype (the published ones are float32) become float32.
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
from isoprobe.models.sundial.config import LOADS, shape_from_fields
from isoprobe.models.sundial.network import SundialNetwork, isoprobe_names

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> SundialNetwork:
    """The network of ``model.checkpoint`` in train mode: ``scratch`` builds the scratch
    fields; a checkpoint builds its config.json's shape and loads its weights."""
    if resolved.kind == "scratch":
        return SundialNetwork(shape_from_fields(scratch_shape(scratch), "model.sizes"))
    source = resolved.location
    config = read_json_config(checkpoint_file(resolved, CONFIG_NAME))
    shape = shape_from_fields(config, f"{source}/config.json")
    network = SundialNetwork(shape)
    weights = isoprobe_names(read_safetensors(checkpoint_file(resolved, WEIGHTS_NAME)))
    described = "the Sundial its config.json describes"
    edited = f"The config was edited or belongs to other weights. {LOADS}"
    return load_float_weights(network, weights, source, described, LOADS, edited)
