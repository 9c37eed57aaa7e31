"""TimesFM 2.5's architecture as data.

The official package (``timesfm`` 3.x, ``timesfm.timesfm_2p5``) builds the published model from a
class attribute (``TimesFM_2p5_200M_Definition``), not from a file: the published directory
(google/timesfm-2.5-200m-pytorch) holds model.safetensors and a config.json that describes no
architecture. isoprobe therefore reads a checkpoint's config.json as data only
(:func:`json.loads`) and takes the shape from it where it has one, written by an isoprobe export
(``model_type`` ``timesfm_2p5`` and the fields of :class:`TimesFm25Shape`), or else the published
shape (``model.sizes.official_200m``, the package's definition), which the weights must then fit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.config_schema import (
    ConfigSchema,
    Key,
    read_shape,
    repeats,
    rising_levels,
    size,
)

MODEL_TYPE = "timesfm_2p5"
#: what another checkpoint is told model=timesfm25 loads
LOADS = (
    "model=timesfm25 loads TimesFM 2.5 checkpoints: google/timesfm-2.5-200m-pytorch "
    "(model.safetensors) or an export of model=timesfm25 (config.json with model_type "
    "'timesfm_2p5' + model.safetensors)."
)
DEFAULT_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class TimesFm25Shape:
    """The architecture, in the official definition's terms: input patches of
    ``input_patch_len`` steps; every token emits ``output_patch_len`` steps of the point head
    and ``output_quantile_len`` steps of the quantile head, each step as 1 + len(quantiles)
    channels (the mean, then the quantiles); ``decode_index`` is the channel appended when
    decoding autoregressively (the median); ``num_layers`` blocks of width ``model_dims``,
    ``num_heads`` heads and a feed-forward of ``hidden_dims``. The tokenizer and both output
    projections are residual blocks whose hidden width is ``model_dims``, as published."""

    input_patch_len: int
    output_patch_len: int
    output_quantile_len: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    num_layers: int
    quantiles: list[float] = field(default_factory=lambda: list(DEFAULT_QUANTILES))
    decode_index: int = 5

    @property
    def head_dim(self) -> int:
        return self.model_dims // self.num_heads

    @property
    def channels(self) -> int:
        """Output channels per step: the mean and every quantile."""
        return 1 + len(self.quantiles)


def parameter_count(config: Mapping[str, Any]) -> int:
    """The parameters of the network ``config`` builds, from its keys alone."""
    width, ff = config["model_dims"], config["hidden_dims"]
    patch = config["input_patch_len"]
    levels = config.get("quantiles", DEFAULT_QUANTILES)
    channels = 1 + (len(levels) if isinstance(levels, (list, tuple)) else len(DEFAULT_QUANTILES))
    tokenizer = 2 * patch * width * 2 + width * width + 3 * width
    head_dim = width // config["num_heads"]
    block = 4 * width * width + 2 * width * ff + 4 * width + 3 * head_dim
    outputs = (config["output_patch_len"] + config["output_quantile_len"]) * channels
    heads = 2 * width * width + 2 * width * outputs
    return tokenizer + config["num_layers"] * block + heads


#: the size keys, checked before anything is built (``quantiles``, a list of levels, is checked
#: by :func:`_check_buildable`)
SCHEMA = ConfigSchema(
    model="TimesFM 2.5",
    keys=(
        size("input_patch_len"),
        size("output_patch_len"),
        size("output_quantile_len"),
        size("model_dims"),
        size("hidden_dims"),
        repeats("num_heads"),
        repeats("num_layers"),
        Key("decode_index", int, low=1, required=False),
    ),
    multiples=(("model_dims", "num_heads"),),
    parameters=parameter_count,
)


def shape_from_fields(fields: Mapping[str, Any], source: str) -> TimesFm25Shape:
    """The :class:`TimesFm25Shape` of ``fields`` (config.json's, or ``model.sizes``'), refusing,
    each named with ``source``: unknown keys, values the :data:`SCHEMA` refuses and shapes the
    network cannot be (odd head width, quantiles not rising in (0, 1), a decode channel that is
    no quantile)."""
    return read_shape(
        TimesFm25Shape,
        fields,
        source,
        SCHEMA,
        LOADS,
        passed={"model_type"},
        buildable=_unbuildable,
    )


def _unbuildable(shape: TimesFm25Shape) -> list[str]:
    """What the network cannot be in ``shape``, field by field."""
    problems = []
    levels = shape.quantiles
    if not rising_levels(levels):
        problems.append(f"quantiles={levels!r} is not a rising list of levels in (0, 1)")
    elif shape.decode_index > len(levels):
        problems.append(
            f"decode_index={shape.decode_index!r} is not a quantile channel (1..{len(levels)})"
        )
    if shape.model_dims % shape.num_heads or shape.head_dim % 2:
        problems.append(
            f"model_dims={shape.model_dims} over num_heads={shape.num_heads} is not an even "
            "head width (rotary positions turn pairs of features)"
        )
    if shape.output_patch_len % shape.input_patch_len:
        problems.append(
            f"output_patch_len={shape.output_patch_len} is not a multiple of input_patch_len="
            f"{shape.input_patch_len} (a decoded output patch is read back as whole patches)"
        )
    return problems


def shape_from_config(
    config: Mapping[str, Any], published: Mapping[str, Any], source: str
) -> tuple[TimesFm25Shape, str]:
    """A checkpoint's config.json (already read as data) -> the shape to build and where it
    comes from: an isoprobe export's config.json gives its own; one that names no
    architecture (the published one) gets the ``published`` shape; another model's is refused
    naming its ``model_type``."""
    model_type = config.get("model_type")
    if model_type == MODEL_TYPE:
        return shape_from_fields(config, f"{source}/config.json"), "its config.json"
    architecture = {f.name for f in dataclasses.fields(TimesFm25Shape)}
    if model_type is not None or architecture & set(config):
        raise CheckpointError(
            f"{source}/config.json is not a TimesFM 2.5 config (model_type={model_type!r}, "
            f"expected {MODEL_TYPE!r} or none, as published). {LOADS}"
        )
    where = "model.sizes.official_200m (its config.json describes no architecture, as published)"
    return shape_from_fields(published, "model.sizes.official_200m"), where


def official_config(shape: TimesFm25Shape) -> dict[str, Any]:
    """config.json as an isoprobe export writes it: ``model_type`` and the shape's fields."""
    return {"model_type": MODEL_TYPE, **dataclasses.asdict(shape)}
