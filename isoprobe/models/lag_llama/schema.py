"""What a Lag-Llama checkpoint directory's config.json must hold (the official ``model_kwargs``
names, all of them required, as the directory's export writes them), and the size of the
network it describes (:mod:`isoprobe.models.config_schema`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from isoprobe.models.config_schema import ConfigSchema, Key, positive, repeats, size
from isoprobe.models.lag_llama.network import NUM_TIME_FEATURES, SCALINGS


def parameter_count(config: Mapping[str, Any]) -> int:
    """Token projection, blocks (attention and SwiGLU, hidden width 8/3 of the width rounded
    up to 256), the Student-t head and the rotary tables over ``max_context_length``."""
    heads, per_head = config["n_head"], config["n_embd_per_head"]
    width = heads * per_head
    hidden = 256 * math.ceil(8 * width / 3 / 256)
    features = len(config["lags_seq"]) + 2 + NUM_TIME_FEATURES
    layer = 4 * width * width + 3 * width * hidden + 2 * width
    rotary = config["max_context_length"] * per_head
    return (features + 5) * width + config["n_layer"] * layer + rotary


SCHEMA = ConfigSchema(
    model="Lag-Llama",
    keys=(
        repeats("n_layer"),
        repeats("n_head"),
        size("n_embd_per_head"),
        size("max_context_length"),
        Key("lags_seq", list, low=0),
        Key("scaling", str, choices=SCALINGS),
        Key("time_feat", bool),
        Key("scale_features", bool),
        positive("rope_base"),
    ),
    parameters=parameter_count,
)
