"""Sundial's config.json as data: the fields of the official ``SundialConfig`` (Liu et al. 2025,
``thuml/sundial-base-128m``), read and checked key by key, and written back in the official
layout by an export.

The published config.json names Python files in ``auto_map`` (Hugging Face remote code); they
are never imported: the file is read with :func:`json.loads` only, and isoprobe builds its own
network from the keys (:class:`SundialShape`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.config_schema import (
    TRANSFORMERS_KEYS,
    ConfigSchema,
    Key,
    fraction,
    positive,
    read_shape,
    repeats,
    size,
)

MODEL_TYPE = "sundial"
#: what a config.json of another kind is told model=sundial loads
LOADS = (
    "model=sundial loads Sundial checkpoints (config.json with Sundial's keys + "
    "model.safetensors), such as thuml/sundial-base-128m, or an export of model=sundial."
)
#: the published checkpoint's ``architectures`` and ``auto_map``, kept in an export so that the
#: official code (its Python files copied beside it) loads the directory as it loads theirs
OFFICIAL_ARCHITECTURES = ["SundialForPrediction"]
OFFICIAL_AUTO_MAP = {
    "AutoConfig": "configuration_sundial.SundialConfig",
    "AutoModelForCausalLM": "modeling_sundial.SundialForPrediction",
}
#: the rotary base the official attention uses whatever ``rope_theta`` says
ROTARY_BASE = 10000


@dataclass(frozen=True)
class SundialShape:
    """The official ``SundialConfig`` fields: tokens of ``input_token_len`` steps embedded by a
    two-layer map of width ``intermediate_size``; ``num_hidden_layers`` pre-norm decoder layers
    of width ``hidden_size`` with ``num_attention_heads`` rotary heads and a SwiGLU of
    ``intermediate_size``; a flow-matching head of ``flow_loss_depth`` residual blocks that
    draws ``output_token_lens[-1]`` steps per token in ``num_sampling_steps`` Euler steps and
    trains on ``diffusion_batch_mul`` noise draws per token. ``rope_theta`` and
    ``max_position_embeddings`` are kept for the export: the official attention turns by base
    10000 whatever ``rope_theta`` says, and the latter sizes a cache, not the maths."""

    input_token_len: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    output_token_lens: list[int] = field(default_factory=lambda: [720])
    hidden_act: str = "silu"
    rope_theta: float = ROTARY_BASE
    dropout_rate: float = 0.1
    max_position_embeddings: int = 10000
    flow_loss_depth: int = 3
    num_sampling_steps: int = 50
    diffusion_batch_mul: int = 4

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def output_length(self) -> int:
        """Steps the flow head draws per token: the last of ``output_token_lens``."""
        return self.output_token_lens[-1]


def parameter_count(config: Mapping[str, Any]) -> int:
    """The parameters of the network ``config`` builds, from its keys alone."""
    width, hidden = config["hidden_size"], config["intermediate_size"]
    patch = config["input_token_len"]
    out = list(config.get("output_token_lens", [720]))[-1]
    embed = 2 * patch * hidden + hidden + hidden * width + width + 2 * patch * width + width
    layer = 4 * width * width + 3 * width + 3 * width * hidden + 4 * width
    head = (
        256 * width
        + width * width
        + 2 * width
        + width * width
        + width
        + out * width
        + width
        + config.get("flow_loss_depth", 3)
        * (2 * width + 2 * (width * width + width) + 3 * width * (width + 1))
        + 2 * width * (width + 1)
        + width * out
        + out
    )
    return embed + config["num_hidden_layers"] * layer + 2 * width + head


SCHEMA = ConfigSchema(
    model="Sundial",
    keys=(
        size("input_token_len"),
        size("hidden_size"),
        size("intermediate_size"),
        repeats("num_hidden_layers"),
        repeats("num_attention_heads"),
        Key("output_token_lens", list, low=1, required=False),
        Key("hidden_act", str, required=False),
        positive("rope_theta", required=False),
        fraction("dropout_rate"),
        size("max_position_embeddings", required=False),
        repeats("flow_loss_depth", required=False),
        repeats("num_sampling_steps", required=False),
        repeats("diffusion_batch_mul", required=False),
    ),
    multiples=(("hidden_size", "num_attention_heads"),),
    parameters=parameter_count,
)


def shape_from_fields(fields: Mapping[str, Any], source: str) -> SundialShape:
    """The :class:`SundialShape` of config.json's (or ``model.sizes``') ``fields``, refusing,
    each named with ``source``: another ``model_type``, unknown keys, values the :data:`SCHEMA`
    refuses and networks isoprobe does not build."""
    model_type = fields.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise CheckpointError(f"{source}: model_type is {model_type!r}, not 'sundial'. {LOADS}")
    return read_shape(
        SundialShape,
        fields,
        source,
        SCHEMA,
        LOADS,
        passed=TRANSFORMERS_KEYS,
        prepare=_lengths_as_list,
        buildable=_unbuildable,
    )


def _lengths_as_list(values: dict[str, Any], source: str) -> None:
    """``output_token_lens`` from the settings (a sequence) as the list config.json holds."""
    if "output_token_lens" in values and not isinstance(values["output_token_lens"], list):
        values["output_token_lens"] = list(values["output_token_lens"])


def _unbuildable(shape: SundialShape) -> list[str]:
    """What isoprobe does not build in ``shape``, field by field."""
    problems = []
    if shape.hidden_act != "silu":
        problems.append(f"hidden_act={shape.hidden_act!r} (Sundial's is 'silu')")
    if shape.rope_theta != ROTARY_BASE:
        problems.append(
            f"rope_theta={shape.rope_theta} (the official attention turns by base "
            f"{ROTARY_BASE} whatever it says, so another value would not mean what it reads)"
        )
    if shape.head_dim % 2:
        problems.append(
            f"hidden_size={shape.hidden_size} over num_attention_heads="
            f"{shape.num_attention_heads} is an odd head width (rotary positions turn halves)"
        )
    return problems


def official_config(shape: SundialShape) -> dict[str, Any]:
    """config.json as the published checkpoint lays it out (and an isoprobe export writes it)."""
    return {
        "architectures": OFFICIAL_ARCHITECTURES,
        "auto_map": OFFICIAL_AUTO_MAP,
        "model_type": MODEL_TYPE,
        **dataclasses.asdict(shape),
    }
