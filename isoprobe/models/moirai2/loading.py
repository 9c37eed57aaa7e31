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

from isoprobe.models.checkpoints import ResolvedCheckpoint, load_published_network
from isoprobe.models.moirai2.config import LOADS, shape_from_fields
from isoprobe.models.moirai2.network import Moirai2Network


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> Moirai2Network:
    """The network of ``model.checkpoint`` in train mode: ``scratch`` builds the scratch
    fields; a checkpoint builds its config.json's shape and loads its weights."""
    return load_published_network(
        resolved,
        scratch,
        Moirai2Network,
        shape_from_fields,
        described="the Moirai 2.0 shape of its config.json",
        loads=LOADS,
    )
