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

from isoprobe.models.checkpoints import ResolvedCheckpoint, load_published_network
from isoprobe.models.sundial.config import LOADS, shape_from_fields
from isoprobe.models.sundial.network import SundialNetwork, isoprobe_names


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> SundialNetwork:
    """The network of ``model.checkpoint`` in train mode: ``scratch`` builds the scratch
    fields; a checkpoint builds its config.json's shape and loads its weights."""
    return load_published_network(
        resolved,
        scratch,
        SundialNetwork,
        shape_from_fields,
        described="the Sundial its config.json describes",
        loads=LOADS,
        rename=lambda weights, _shape: isoprobe_names(weights),
        fix=f"The config was edited or belongs to other weights. {LOADS}",
    )
