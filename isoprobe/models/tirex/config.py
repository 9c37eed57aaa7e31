"""TiRex's architecture as data.

The official package (``tirex-ts``) builds its model from a Lightning checkpoint's
``hyper_parameters``: ``model_config`` (patch sizes, quantile levels, ``block_kwargs`` and
``input_ff_dim``) and ``train_ctx_len``. isoprobe flattens these into :class:`TirexShape`: what an
isoprobe export writes into config.json (``model_type`` ``tirex``), what ``model.sizes`` gives
``checkpoint=scratch``, and what :func:`shape_from_hyperparameters` reads out of a published
checkpoint (as data, through :mod:`isoprobe.models.tirex.loading`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.config_schema import (
    ConfigSchema,
    check_model_type,
    positive,
    read_shape,
    repeats,
    rising_levels,
    size,
)

MODEL_TYPE = "tirex"
#: what another checkpoint is told model=tirex loads
LOADS = (
    "model=tirex loads TiRex checkpoints: the published NX-AI/TiRex (model.ckpt, as a hub id or "
    "model.checkpoint=<path>/model.ckpt) or an export of model=tirex (config.json with "
    "model_type 'tirex' + model.safetensors)."
)
DEFAULT_QUANTILES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: the feed-forward's width is ``embedding_dim * ffn_proj_factor`` rounded up to this multiple
FFN_MULTIPLE = 64


@dataclass(frozen=True)
class TirexShape:
    """The architecture in the official configuration's terms: patches of ``input_patch_size``
    steps in, ``output_patch_size`` (equal) out at every level of ``quantiles``; a residual
    input and output layer of hidden width ``input_ff_dim``; ``num_blocks`` sLSTM blocks of
    width ``embedding_dim`` with ``num_heads`` heads and a gated feed-forward of width
    ``ffn_proj_factor * embedding_dim`` (rounded up to 64); every window is cut or left-padded
    to ``train_ctx_len`` steps before it is read."""

    input_patch_size: int
    output_patch_size: int
    embedding_dim: int
    num_heads: int
    num_blocks: int
    input_ff_dim: int
    train_ctx_len: int
    ffn_proj_factor: float = 2.6667
    quantiles: list[float] = field(default_factory=lambda: list(DEFAULT_QUANTILES))

    @property
    def head_dim(self) -> int:
        return self.embedding_dim // self.num_heads

    @property
    def ffn_dim(self) -> int:
        """The feed-forward's width: ``embedding_dim * ffn_proj_factor`` rounded up to 64."""
        raw = self.embedding_dim * self.ffn_proj_factor
        return int(-(-raw // FFN_MULTIPLE) * FFN_MULTIPLE)

    @property
    def tokens(self) -> int:
        """Patches (tokens) of a window of ``train_ctx_len`` steps."""
        return self.train_ctx_len // self.input_patch_size


def _residual_block(inputs: int, hidden: int, outputs: int) -> int:
    """Parameters of a residual layer: hidden and residual paths, each linear with a bias."""
    return inputs * hidden + hidden + hidden * outputs + outputs + inputs * outputs + outputs


def parameter_count(config: Mapping[str, Any]) -> int:
    """The parameters of the network ``config`` builds, from its keys alone."""
    width, hidden = config["embedding_dim"], config["input_ff_dim"]
    patch = config["input_patch_size"]
    levels = config.get("quantiles", DEFAULT_QUANTILES)
    outputs = (len(levels) if isinstance(levels, list) else len(DEFAULT_QUANTILES)) * patch
    factor = config.get("ffn_proj_factor", 2.6667)
    ffn = -(-width * factor // FFN_MULTIPLE) * FFN_MULTIPLE
    head_dim = width // config["num_heads"]
    block = 8 * width * head_dim + 4 * width + 3 * width + 3 * width * ffn
    residuals = _residual_block(2 * patch, hidden, width) + _residual_block(width, hidden, outputs)
    return int(config["num_blocks"] * block + residuals + width)


#: the keys checked before anything is built (``quantiles`` by :func:`_check_buildable`)
SCHEMA = ConfigSchema(
    model="TiRex",
    keys=(
        size("input_patch_size"),
        size("output_patch_size"),
        size("embedding_dim"),
        repeats("num_heads"),
        repeats("num_blocks"),
        size("input_ff_dim"),
        size("train_ctx_len"),
        positive("ffn_proj_factor", required=False),
    ),
    multiples=(("embedding_dim", "num_heads"), ("train_ctx_len", "input_patch_size")),
    parameters=parameter_count,
)


def shape_from_fields(fields: Mapping[str, Any], source: str) -> TirexShape:
    """The :class:`TirexShape` of ``fields`` (config.json's or ``model.sizes``'), refusing, each
    named with ``source``: unknown keys, values :data:`SCHEMA` refuses, and shapes the network
    cannot be."""
    return read_shape(
        TirexShape, fields, source, SCHEMA, LOADS, passed={"model_type"}, buildable=_unbuildable
    )


def _unbuildable(shape: TirexShape) -> list[str]:
    """What the network cannot be in ``shape``, field by field."""
    problems = []
    levels = shape.quantiles
    if not (rising_levels(levels) and 0.5 in levels):
        problems.append(f"quantiles={levels!r} is not a rising list of levels in (0, 1) with 0.5")
    if shape.output_patch_size != shape.input_patch_size:
        problems.append(
            f"output_patch_size={shape.output_patch_size} differs from input_patch_size="
            f"{shape.input_patch_size} (TiRex forecasts the patch after each input patch)"
        )
    return problems


def shape_from_config(config: Mapping[str, Any], source: str) -> TirexShape:
    """An export's config.json (already read as data): another model's is refused naming its
    ``model_type``."""
    check_model_type(config, MODEL_TYPE, SCHEMA.model, source, LOADS)
    return shape_from_fields(config, f"{source}/config.json")


def shape_from_hyperparameters(hyper: Any, source: str) -> TirexShape:
    """The shape of a published checkpoint's ``hyper_parameters``: ``model_config`` (patch
    sizes, ``quantiles``, ``input_ff_dim`` and ``block_kwargs``: ``embedding_dim``,
    ``num_heads``, ``num_blocks``, ``ffn_proj_factor``) and ``train_ctx_len``."""
    try:
        model = hyper["model_config"]
        blocks = model["block_kwargs"]
        fields = {
            "input_patch_size": model["input_patch_size"],
            "output_patch_size": model["output_patch_size"],
            "quantiles": list(model["quantiles"]),
            "input_ff_dim": model["input_ff_dim"],
            "embedding_dim": blocks["embedding_dim"],
            "num_heads": blocks["num_heads"],
            "num_blocks": blocks["num_blocks"],
            "train_ctx_len": hyper["train_ctx_len"],
        }
        if "ffn_proj_factor" in blocks:
            fields["ffn_proj_factor"] = float(blocks["ffn_proj_factor"])
    except (KeyError, TypeError) as err:
        raise CheckpointError(
            f"{source} is not a TiRex checkpoint: its hyper_parameters lack {err} (model_config "
            f"with block_kwargs, and train_ctx_len). {LOADS}"
        ) from None
    return shape_from_fields(fields, f"{source} (hyper_parameters)")


def official_config(shape: TirexShape) -> dict[str, Any]:
    """config.json as an isoprobe export writes it: ``model_type`` and the shape's fields."""
    return {"model_type": MODEL_TYPE, **dataclasses.asdict(shape)}
