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

from isoprobe.models.checkpoints import ResolvedCheckpoint, load_published_network
from isoprobe.models.toto.config import LOADS, shape_from_fields
from isoprobe.models.toto.network import TotoNetwork, isoprobe_names


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> TotoNetwork:
    """The network of ``model.checkpoint`` in train mode: ``scratch`` builds the scratch
    fields; a checkpoint builds its config.json's shape and loads its weights."""
    return load_published_network(
        resolved,
        scratch,
        TotoNetwork,
        shape_from_fields,
        described="the Toto its config.json describes",
        loads=LOADS,
        rename=isoprobe_names,
        fix=f"The config was edited or belongs to other weights. {LOADS}",
    )
