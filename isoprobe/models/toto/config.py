"""Toto's architecture as data: the keys of the published config.json (Datadog/Toto-Open-Base-1.0).

The official package (``toto-ts``) builds ``TotoBackbone(**config)`` from that file; isoprobe reads
the same file with :func:`json.loads` only and builds its own network from the same keys
(:class:`TotoShape`). Class names in it (``scaler_cls``, ``output_distribution_classes``) are
strings the package looks up in a table; isoprobe implements the one scaler and the one output
head the published model uses and refuses another by name. An export writes config.json in
this same format, so that the package loads an isoprobe export too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.config_schema import (
    ConfigSchema,
    Key,
    fraction,
    positive,
    read_shape,
    repeats,
    size,
)

#: the published model's scaler and output head, as config.json names them
CAUSAL_PATCH_SCALER = "<class 'model.scaler.CausalPatchStdMeanScaler'>"
STUDENT_T_MIXTURE = "<class 'model.distribution.MixtureOfStudentTsOutput'>"
#: what another checkpoint is told model=toto loads
LOADS = (
    "model=toto loads Toto checkpoints: Datadog/Toto-Open-Base-1.0 or an export of model=toto "
    "(config.json with Toto's keys + model.safetensors), with the causal patch scaler and the "
    "Student-T mixture head."
)


@dataclass(frozen=True)
class TotoShape:
    """The official constructor's arguments: patches of ``patch_size`` steps (``stride`` must
    equal it), ``num_layers`` transformer layers of width ``embed_dim`` with ``num_heads`` heads
    and a SwiGLU feed-forward of ``mlp_hidden_dim``; one layer in every
    ``spacewise_every_n_layers`` attends across variates (space-wise; the first of each group
    when ``spacewise_first``), the others across patches (time-wise; -1: none space-wise);
    a mixture of ``output_distribution_kwargs['k_components']`` Student-T components per step.
    ``stabilize_with_global`` clamps the causal scale within ``10^±scale_factor_exponent`` of
    the context's global one. ``use_memory_efficient_attention`` (xFormers) chooses a kernel in
    the package, not the maths: it is kept for the export only."""

    patch_size: int
    stride: int
    embed_dim: int
    num_layers: int
    num_heads: int
    mlp_hidden_dim: int
    spacewise_every_n_layers: int
    dropout: float = 0.0
    spacewise_first: bool = True
    scaler_cls: str = CAUSAL_PATCH_SCALER
    output_distribution_classes: list[str] = field(default_factory=lambda: [STUDENT_T_MIXTURE])
    output_distribution_kwargs: dict[str, int] = field(default_factory=lambda: {"k_components": 8})
    use_memory_efficient_attention: bool = True
    stabilize_with_global: bool = True
    scale_factor_exponent: float = 10.0

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def components(self) -> int:
        return self.output_distribution_kwargs["k_components"]

    def layer_is_spacewise(self) -> list[bool]:
        """Per official layer, whether it attends across variates (the package's
        ``_get_layer_types``)."""
        every = self.spacewise_every_n_layers
        if every == -1:
            return [False] * self.num_layers
        group = [False] * (every - 1)
        group = [True, *group] if self.spacewise_first else [*group, True]
        return group * (self.num_layers // every)


def parameter_count(config: Mapping[str, Any]) -> int:
    """The parameters of the network ``config`` builds, from its keys alone."""
    width, hidden, patch = config["embed_dim"], config["mlp_hidden_dim"], config["patch_size"]
    components = config.get("output_distribution_kwargs", {}).get("k_components", 8)
    layer = 2 * width + 4 * width * width + 4 * width + 3 * width * hidden + 2 * hidden + width
    unembed = width * width * patch + width * patch
    head = 4 * (width * components + components)
    return patch * width + width + config["num_layers"] * layer + unembed + head


SCHEMA = ConfigSchema(
    model="Toto",
    keys=(
        size("patch_size"),
        size("stride"),
        size("embed_dim"),
        repeats("num_layers"),
        repeats("num_heads"),
        size("mlp_hidden_dim"),
        Key("spacewise_every_n_layers", int, low=-1, high=4096),
        fraction("dropout"),
        Key("spacewise_first", bool, required=False),
        Key("scaler_cls", str, required=False),
        repeats("output_distribution_kwargs.k_components", required=False),
        Key("use_memory_efficient_attention", bool, required=False),
        Key("stabilize_with_global", bool, required=False),
        positive("scale_factor_exponent", required=False),
    ),
    multiples=(("embed_dim", "num_heads"),),
    parameters=parameter_count,
)


def shape_from_fields(fields: Mapping[str, Any], source: str) -> TotoShape:
    """The :class:`TotoShape` of ``fields`` (config.json's, or ``model.sizes``'), refusing,
    each named with ``source``: unknown keys, values the :data:`SCHEMA` refuses and networks
    isoprobe does not build (another scaler or head, a stride other than the patch, no
    time-wise layer, an odd head width)."""
    return read_shape(
        TotoShape, fields, source, SCHEMA, LOADS, prepare=_plain_containers, buildable=_unbuildable
    )


def _plain_containers(values: dict[str, Any], source: str) -> None:
    """Refuse output-head kwargs that are no JSON object or classes that are no JSON list, and
    copy them (the settings' own containers) into a dict and a list."""
    for name, what, kind in (
        ("output_distribution_kwargs", "object", dict),
        ("output_distribution_classes", "list", list),
    ):
        if name not in values:
            continue
        value = values[name]
        if not (isinstance(value, Mapping) if kind is dict else _is_list(value)):
            raise CheckpointError(f"{source}: {name} is {value!r}, not a JSON {what}. {LOADS}")
        values[name] = kind(value)


def _is_list(value: Any) -> bool:
    """A JSON list (or the settings' list), not a string."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _unbuildable(shape: TotoShape) -> list[str]:
    """What isoprobe does not build in ``shape``, field by field."""
    problems = []
    if shape.scaler_cls != CAUSAL_PATCH_SCALER:
        problems.append(f"scaler_cls={shape.scaler_cls!r} is not {CAUSAL_PATCH_SCALER!r}")
    if shape.output_distribution_classes != [STUDENT_T_MIXTURE]:
        problems.append(
            f"output_distribution_classes={shape.output_distribution_classes!r} is not "
            f"[{STUDENT_T_MIXTURE!r}]"
        )
    if set(shape.output_distribution_kwargs) != {"k_components"}:
        problems.append(
            f"output_distribution_kwargs={shape.output_distribution_kwargs!r} holds other keys "
            "than k_components"
        )
    if shape.stride != shape.patch_size:
        problems.append(f"stride={shape.stride} differs from patch_size={shape.patch_size}")
    every = shape.spacewise_every_n_layers
    if every != -1 and (every < 2 or shape.num_layers % every):
        problems.append(
            f"spacewise_every_n_layers={every} is neither -1 nor a divisor >= 2 of "
            f"num_layers={shape.num_layers} (every group needs a time-wise layer)"
        )
    if shape.head_dim % 2:
        problems.append(
            f"embed_dim={shape.embed_dim} over num_heads={shape.num_heads} is an odd head width "
            "(rotary positions turn pairs of features)"
        )
    return problems


def official_config(shape: TotoShape) -> dict[str, Any]:
    """config.json as the package reads it (and an isoprobe export writes it)."""
    return dataclasses.asdict(shape)
