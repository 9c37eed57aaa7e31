"""Moirai 2.0's architecture as data.

The published directory (Salesforce/moirai-2.0-R-small) holds model.safetensors and the
config.json ``huggingface_hub``'s ``PyTorchModelHubMixin`` writes: the keyword arguments of
uni2ts 2.0's ``Moirai2Module`` (the fields of :class:`Moirai2Shape`), no ``model_type``. isoprobe
reads it as data only (:func:`json.loads`), checks it against :data:`SCHEMA` and builds that
shape; an isoprobe export writes the same file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from isoprobe.models.config_schema import (
    ConfigSchema,
    Key,
    fraction,
    read_shape,
    repeats,
    rising_levels,
    size,
)

#: what another checkpoint is told model=moirai2 loads
LOADS = (
    "model=moirai2 loads Moirai 2.0 checkpoints: Salesforce/moirai-2.0-R-small or an export of "
    "model=moirai2 (config.json with Moirai2Module's arguments + model.safetensors); Moirai 1.x "
    "checkpoints load with model=moirai."
)
DEFAULT_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: the width of one attention head: uni2ts' TransformerEncoder takes ``d_model // 64`` heads
HEAD_WIDTH = 64


@dataclass(frozen=True)
class Moirai2Shape:
    """The architecture, in ``Moirai2Module``'s terms: patches of ``patch_size`` steps; blocks
    of width ``d_model`` (``d_model // 64`` heads of 64) with a gated feed-forward of ``d_ff``;
    every token emits ``num_predict_token`` patches at each of ``quantile_levels``; ``scaling``
    standardises each window by its observed context. ``max_seq_len`` sizes the official
    rotary table, which grows on demand, so it limits nothing; the dropouts act in training."""

    d_model: int
    d_ff: int
    num_layers: int
    patch_size: int
    max_seq_len: int = 512
    attn_dropout_p: float = 0.0
    dropout_p: float = 0.0
    scaling: bool = True
    num_predict_token: int = 1
    quantile_levels: list[float] = field(default_factory=lambda: list(DEFAULT_QUANTILES))

    @property
    def num_heads(self) -> int:
        return self.d_model // HEAD_WIDTH

    @property
    def outputs(self) -> int:
        """The output head's width: predicted patches x levels x steps."""
        return self.num_predict_token * len(self.quantile_levels) * self.patch_size


def parameter_count(config: Mapping[str, Any]) -> int:
    """The parameters of the network ``config`` builds, from its keys alone."""
    width, ff, patch = config["d_model"], config["d_ff"], config["patch_size"]
    levels = config.get("quantile_levels", DEFAULT_QUANTILES)
    count = len(levels) if isinstance(levels, (list, tuple)) else len(DEFAULT_QUANTILES)
    outputs = config.get("num_predict_token", 1) * count * patch
    tokens_in = 2 * patch * width * 2 + width * width + 3 * width
    heads = width // HEAD_WIDTH
    block = 4 * width * width + 3 * width * ff + 2 * heads + 2 * HEAD_WIDTH + 2 * width
    tokens_out = width * width + width + 2 * width * outputs + 2 * outputs
    return tokens_in + config["num_layers"] * block + width + tokens_out


#: config.json's keys, checked before anything is built (``quantile_levels``, a list of levels,
#: by :func:`_check_buildable`)
SCHEMA = ConfigSchema(
    model="Moirai 2.0",
    keys=(
        size("d_model"),
        size("d_ff"),
        repeats("num_layers"),
        size("patch_size"),
        size("max_seq_len", required=False),
        fraction("attn_dropout_p"),
        fraction("dropout_p"),
        Key("scaling", bool, required=False),
        repeats("num_predict_token", required=False),
    ),
    multiples=(("d_model", HEAD_WIDTH),),
    parameters=parameter_count,
)


def shape_from_fields(fields: Mapping[str, Any], source: str) -> Moirai2Shape:
    """The :class:`Moirai2Shape` of ``fields`` (config.json's, or ``model.sizes``'), refusing,
    each named with ``source``: unknown keys (a Moirai 1.x config's ``patch_sizes`` and
    ``distr_output`` among them), values :data:`SCHEMA` refuses and quantile levels the head
    cannot have."""
    return read_shape(Moirai2Shape, fields, source, SCHEMA, LOADS, buildable=_unbuildable)


def _unbuildable(shape: Moirai2Shape) -> list[str]:
    levels = shape.quantile_levels
    if rising_levels(levels):
        return []
    return [f"quantile_levels={levels!r} is not a rising list of levels in (0, 1)"]


def official_config(shape: Moirai2Shape) -> dict[str, Any]:
    """config.json as the published checkpoint has it: ``Moirai2Module``'s arguments."""
    return dataclasses.asdict(shape)
