"""Where a Time-MoE network's weights come from: a scratch shape (``model.sizes``), or a
checkpoint directory / hub id in the published layout (config.json + model.safetensors, as
Maple728/TimeMoE-50M ships them).

Only data is read: config.json with :func:`json.loads` (its ``auto_map`` names Python files
that are never imported, no ``trust_remote_code``), the weights with safetensors. The published
weights are bfloat16; they become float32. Every tensor the config's shape needs must be there
with its shape, and nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from isoprobe.models.checkpoints import REEXPORT, ResolvedCheckpoint, load_published_network
from isoprobe.models.time_moe.config import LOADS, shape_from_config, shape_from_fields
from isoprobe.models.time_moe.network import TimeMoeNetwork


def load_network(resolved: ResolvedCheckpoint, scratch: Mapping[str, Any] | None) -> TimeMoeNetwork:
    """The network of ``model.checkpoint`` (see the module docstring), in train mode."""
    return load_published_network(
        resolved,
        scratch,
        TimeMoeNetwork,
        shape_from_fields,
        described="its config.json",
        loads=LOADS,
        shape_from_config=shape_from_config,
        fix=REEXPORT,
    )
