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

from isoprobe.models.checkpoints import (
    ResolvedCheckpoint,
    checkpoint_file,
    load_float_weights,
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
    described = f"the TimesFM 2.5 shape of {where}"
    return load_float_weights(network, weights, source, described, LOADS)
