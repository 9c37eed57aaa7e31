"""Time-MoE's config.json as data: the architecture's fields (those of the official
``TimeMoeConfig``, Shi et al. 2024, github.com/Time-MoE/Time-MoE) read and checked key by key,
and written back in the official layout by an export.

A published checkpoint's config.json (Maple728/TimeMoE-50M, -200M) names its Python files in
``auto_map``; they are never imported: the file is read with :func:`json.loads` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from isoprobe.models.config_schema import (
    TRANSFORMERS_KEYS,
    ConfigSchema,
    Key,
    check_model_type,
    positive,
    read_shape,
    repeats,
    size,
)

MODEL_TYPE = "time_moe"
#: what a config.json of another kind is told model=time_moe loads
LOADS = (
    "model=time_moe loads Time-MoE checkpoints (config.json with model_type 'time_moe' + "
    "model.safetensors), such as Maple728/TimeMoE-50M, or an export of model=time_moe."
)
#: the ``auto_map`` of the published checkpoints, kept in an export so that the official code
#: (with its Python files copied beside it) loads the directory as it loads theirs
OFFICIAL_AUTO_MAP = {
    "AutoConfig": "configuration_time_moe.TimeMoeConfig",
    "AutoModelForCausalLM": "modeling_time_moe.TimeMoeForPrediction",
}


@dataclass(frozen=True)
class TimeMoeShape:
    """The architecture: the official ``TimeMoeConfig`` fields isoprobe builds from (defaults
    as there, where the official config has one that the published checkpoints keep; the
    experts' count and the number routed per token set the layers' sizes and have none here:
    the official default of 1 expert routed 2 per token builds nothing)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_experts: int
    num_experts_per_tok: int
    horizon_lengths: list[int] = field(default_factory=lambda: [1])
    num_key_value_heads: int | None = None
    input_size: int = 1
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    use_dense: bool = False
    apply_aux_loss: bool = True
    router_aux_loss_factor: float = 0.02

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def expert_size(self) -> int:
        """Each routed expert's SwiGLU width: ``intermediate_size // num_experts_per_tok`` (the
        shared expert has the whole ``intermediate_size``), as the official layer builds them."""
        return self.intermediate_size // self.num_experts_per_tok


def parameter_count(config: Mapping[str, Any]) -> int:
    """The parameters of the network a config builds (attention, shared and routed experts,
    router, norms, value embedding and one head per horizon), from its keys alone."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_width = (config.get("num_key_value_heads") or heads) * (hidden // heads)
    intermediate, experts = config["intermediate_size"], config["num_experts"]
    expert_size = intermediate // config["num_experts_per_tok"]
    inputs = config.get("input_size", 1)
    layer = (
        hidden * (2 * hidden + 2 * kv_width)
        + 3 * hidden * intermediate
        + experts * 3 * hidden * expert_size
        + hidden * (experts + 1)
        + 2 * hidden
    )
    heads_out = sum(config.get("horizon_lengths", [1])) * hidden * inputs
    return config["num_hidden_layers"] * layer + 2 * inputs * hidden + heads_out + hidden


#: the keys isoprobe reads, required where the official format has no default (module docs)
SCHEMA = ConfigSchema(
    model="Time-MoE",
    keys=(
        size("hidden_size"),
        size("intermediate_size"),
        repeats("num_hidden_layers"),
        repeats("num_attention_heads"),
        repeats("num_experts"),
        repeats("num_experts_per_tok"),
        repeats("num_key_value_heads", required=False, nullable=True),
        Key("horizon_lengths", list, low=1, required=False),
        size("input_size", required=False),
        Key("hidden_act", str, required=False),
        size("max_position_embeddings", required=False),
        positive("rms_norm_eps", required=False),
        positive("rope_theta", required=False),
        Key("use_dense", bool, required=False),
        Key("apply_aux_loss", bool, required=False),
        Key("router_aux_loss_factor", float, low=0, required=False),
    ),
    multiples=(
        ("hidden_size", "num_attention_heads"),
        ("num_attention_heads", "num_key_value_heads"),
    ),
    parameters=parameter_count,
)


def shape_from_fields(fields: Mapping[str, Any], source: str) -> TimeMoeShape:
    """The :class:`TimeMoeShape` of config.json's (or ``model.sizes``') ``fields``, refusing
    unknown keys, values the :data:`SCHEMA` refuses (missing, of the wrong type, out of bounds,
    too large for memory) and what isoprobe does not build, each named with ``source``."""
    return read_shape(
        TimeMoeShape,
        fields,
        source,
        SCHEMA,
        LOADS,
        passed=TRANSFORMERS_KEYS | {"tie_word_embeddings", "attention_dropout"},
        prepare=_one_horizon_as_list,
        buildable=_unbuildable,
    )


def _one_horizon_as_list(values: dict[str, Any], source: str) -> None:
    """The official config accepts one int for ``horizon_lengths``."""
    if isinstance(values.get("horizon_lengths"), int):
        values["horizon_lengths"] = [values["horizon_lengths"]]


def _unbuildable(shape: TimeMoeShape) -> list[str]:
    """What the official code builds differently in ``shape`` or isoprobe does not build (a
    multivariate input, a dense feed-forward, another activation), field by field."""
    problems = []
    horizons = shape.horizon_lengths
    if not (
        isinstance(horizons, list)
        and horizons
        and all(isinstance(h, int) and h > 0 for h in horizons)
        and horizons == sorted(set(horizons))
    ):
        problems.append(f"horizon_lengths={horizons!r} is not a rising list of positive ints")
    if shape.input_size != 1:
        problems.append(f"input_size={shape.input_size} (isoprobe's windows are univariate: 1)")
    if shape.use_dense or not shape.apply_aux_loss:
        problems.append(
            f"use_dense={shape.use_dense}, apply_aux_loss={shape.apply_aux_loss} (isoprobe "
            "builds the sparse mixture of experts with its balance loss: false, true)"
        )
    if shape.hidden_act != "silu":
        problems.append(f"hidden_act={shape.hidden_act!r} (Time-MoE's is 'silu')")
    if shape.hidden_size % shape.num_attention_heads:
        problems.append(
            f"hidden_size={shape.hidden_size} is not a multiple of num_attention_heads="
            f"{shape.num_attention_heads}"
        )
    if shape.num_attention_heads % shape.kv_heads:
        problems.append(
            f"num_attention_heads={shape.num_attention_heads} is not a multiple of "
            f"num_key_value_heads={shape.kv_heads}"
        )
    if not 1 <= shape.num_experts_per_tok <= shape.num_experts:
        problems.append(
            f"num_experts_per_tok={shape.num_experts_per_tok} is not in 1..num_experts="
            f"{shape.num_experts}"
        )
    return problems


def shape_from_config(config: Mapping[str, Any], source: str) -> TimeMoeShape:
    """A checkpoint's config.json (already read as data): another architecture's is refused
    naming its ``model_type``, a Time-MoE one becomes its :class:`TimeMoeShape`."""
    check_model_type(config, MODEL_TYPE, SCHEMA.model, source, LOADS)
    return shape_from_fields(config, f"{source}/config.json")


def official_config(shape: TimeMoeShape, dtype: str) -> dict[str, Any]:
    """config.json as the published checkpoints lay it out, for ``shape`` in ``dtype``."""
    fields = dataclasses.asdict(shape)
    fields["num_key_value_heads"] = shape.kv_heads
    return {
        "architectures": ["TimeMoeForPrediction"],
        "auto_map": dict(OFFICIAL_AUTO_MAP),
        "model_type": MODEL_TYPE,
        **fields,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "use_cache": True,
    }
