"""A checkpoint's config.json checked against its model's schema before anything is built.

Each loader declares a :class:`ConfigSchema`: the keys it reads (:class:`Key`: type, bounds,
whether the official format may leave it out), the divisibility the architecture needs
(``multiples``) and ``parameters``, an estimate of the parameter count from the config alone.
:func:`check_config` refuses, in one :class:`ConfigSchemaError` naming the file, every key
that is missing, of the wrong type ("64", 64.0 and true are not whole numbers; NaN and Infinity
are not numbers) or out of bounds, then a model whose float32 weights would not fit in the
memory available, so that a received config.json never crashes, hangs or exhausts memory
while the model is built.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

from isoprobe.models.checkpoints import CheckpointError, read_json_config

Shape = TypeVar("Shape")

GIB = 2**30
#: bytes per parameter: every loader builds its model in float32
PARAMETER_BYTES = 4
#: layers, blocks or heads of any published model are far fewer: a larger count is a typo
#: that would build modules for hours before the memory estimate could matter
MAX_REPEATS = 4096

FIX = (
    "The file was edited or belongs to another model: fix the value or export the checkpoint again."
)
_WHAT = {
    int: "a whole number (a JSON integer such as 64, not a string, float or boolean)",
    float: "a finite number (not a string, boolean, NaN or Infinity)",
    bool: "true or false",
    str: "a string",
    list: "a list of whole numbers",
}
#: keys transformers writes into every config.json: read past, never acted on (``auto_map``
#: names Python files that are never imported)
TRANSFORMERS_KEYS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "auto_map",
        "model_type",
        "torch_dtype",
        "dtype",
        "transformers_version",
        "use_cache",
        "initializer_range",
    }
)


class ConfigSchemaError(CheckpointError, ValueError):
    """A config.json value a model's schema refuses, or a model too large to build."""


@dataclass(frozen=True)
class Key:
    """One config.json key: its type (``int``, ``float``, ``bool``, ``str`` or ``list``, a list of
    whole numbers), its bounds (``low``/``high`` inclusive; ``above``, exclusive, for a number
    that must be positive), ``choices`` for a string, and whether the official format may omit
    it (``required=False``: the loader's default applies). A dotted name reads a nested object
    (``chronos_config.prediction_length``)."""

    name: str
    kind: type
    low: float | None = None
    high: float | None = None
    above: float | None = None
    required: bool = True
    choices: tuple[str, ...] = ()
    nullable: bool = False

    def expected(self) -> str:
        words = [_WHAT[self.kind]]
        if self.above is not None:
            words.append(f"> {self.above:g}")
        if self.low is not None:
            words.append(f">= {self.low:g}")
        if self.high is not None:
            words.append(f"<= {self.high:g}")
        if self.choices:
            words.append(f"one of {list(self.choices)}")
        return ", ".join(words) + (" or null" if self.nullable else "")

    def fits(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if self.kind is list:
            return isinstance(value, list) and bool(value) and all(map(self._fits_one, value))
        return self._fits_one(value)

    def _fits_one(self, value: Any) -> bool:
        kind = int if self.kind is list else self.kind
        if kind is bool or kind is str:
            return isinstance(value, kind) and (not self.choices or value in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            return False
        if kind is float and not math.isfinite(value):
            return False
        return (
            (self.low is None or value >= self.low)
            and (self.high is None or value <= self.high)
            and (self.above is None or value > self.above)
        )


def size(name: str, required: bool = True) -> Key:
    """A width, length or count: a whole number >= 1."""
    return Key(name, int, low=1, required=required)


def repeats(name: str, required: bool = True, nullable: bool = False) -> Key:
    """A number of layers, blocks or heads: a whole number in [1, :data:`MAX_REPEATS`]."""
    return Key(name, int, low=1, high=MAX_REPEATS, required=required, nullable=nullable)


def positive(name: str, required: bool = True) -> Key:
    """A finite number > 0 (an epsilon, a rotary base, a ratio)."""
    return Key(name, float, above=0, required=required)


def fraction(name: str, required: bool = False) -> Key:
    """A finite number in [0, 1] (a dropout, a loss weight)."""
    return Key(name, float, low=0, high=1, required=required)


@dataclass(frozen=True)
class ConfigSchema:
    """What a model's config.json must hold (module docstring).

    ``model`` names it in messages; ``model_types`` and ``architectures``, when given, are the
    ``model_type`` and ``architectures`` values it checks (a config of another model is left to
    the loader, which names what it is instead);
    ``multiples`` are pairs (key, divisor key or number) the architecture needs divisible, a
    pair with an absent key skipped; ``parameters`` estimates the parameter count from a config
    whose keys passed."""

    model: str
    keys: tuple[Key, ...]
    parameters: Callable[[Mapping[str, Any]], float]
    multiples: tuple[tuple[str, str | int], ...] = ()
    model_types: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()

    def describes(self, config: Mapping[str, Any]) -> bool:
        """Whether ``config`` is of this schema's model (by ``model_type`` and architecture)."""
        if self.model_types and config.get("model_type") not in self.model_types:
            return False
        named = config.get("architectures")
        if self.architectures and isinstance(named, list) and named:
            return any(name in self.architectures for name in named)
        return True


_ABSENT = object()


def lookup(config: Mapping[str, Any], name: str, default: Any = _ABSENT) -> Any:
    """The value of the (dotted) key ``name`` in ``config``, or ``default`` where it is absent."""
    value: Any = config
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return default
        value = value[part]
    return value


def check_config(config: Mapping[str, Any], schema: ConfigSchema, source: str) -> None:
    """Refuse ``config`` (read from ``source``, a config.json or the settings it came from)
    unless every key of ``schema`` fits and the model it describes fits in memory."""
    if not schema.describes(config):
        return
    problems = []
    for key in schema.keys:
        value = lookup(config, key.name)
        if value is _ABSENT:
            if key.required:
                problems.append(f"{key.name} is missing; expected {key.expected()}")
        elif not key.fits(value):
            problems.append(f"{key.name} is {value!r}; expected {key.expected()}")
    if problems:
        raise ConfigSchemaError(
            f"{source} is not a valid {schema.model} config:\n  "
            + "\n  ".join(problems)
            + f"\n{FIX}"
        )
    for name, divisor in schema.multiples:
        value = lookup(config, name, None)
        by = divisor if isinstance(divisor, int) else lookup(config, divisor, None)
        if value is not None and by is not None and value % by:
            of = f"{divisor}={by}" if isinstance(divisor, str) else str(by)
            raise ConfigSchemaError(
                f"{source}: {name}={value} is not a multiple of {of}, which the {schema.model} "
                f"architecture needs. {FIX}"
            )
    check_fits_memory(config, schema, source)


def check_fits_memory(config: Mapping[str, Any], schema: ConfigSchema, source: str) -> None:
    """Refuse a model whose float32 parameters alone would exceed the available memory,
    naming the estimate and the size keys it comes from, before anything is allocated."""
    # in float, capped: a count past float's range (a 400-digit width) still prints
    needed = float(min(schema.parameters(config), 1e300)) * PARAMETER_BYTES
    available = psutil.virtual_memory().available
    if needed > available:
        sizes = ", ".join(
            f"{key.name}={lookup(config, key.name)}"
            for key in schema.keys
            if key.kind is int and lookup(config, key.name, None) is not None
        )
        raise ConfigSchemaError(
            f"{source} describes a {schema.model} of about {needed / PARAMETER_BYTES:.3g} "
            f"parameters ({needed / GIB:.3g} GiB in float32), more than the {available / GIB:.1f} "
            f"GiB of memory available ({sizes}). {FIX}"
        )


def read_shape(
    shape: type[Shape],
    fields: Mapping[str, Any],
    source: str,
    schema: ConfigSchema,
    loads: str,
    *,
    passed: Collection[str] = (),
    prepare: Callable[[dict[str, Any], str], None] | None = None,
    buildable: Callable[[Shape], list[str]] | None = None,
) -> Shape:
    """The ``shape`` dataclass of config.json's (or ``model.sizes``') ``fields``, refusing in
    one :class:`CheckpointError` naming ``source`` and what loads (``loads``): keys neither its
    fields nor ``passed`` (read past), values ``schema`` refuses, and the problems ``buildable``
    lists for the shape. ``prepare(values, source)`` may first put values in the fields' form."""
    known = {f.name for f in dataclasses.fields(shape)}
    unexpected = sorted(set(fields) - known - set(passed))
    if unexpected:
        also = f" (and {sorted(passed)}, read past)" if passed else ""
        raise CheckpointError(
            f"{source} has unexpected keys {unexpected}; a {schema.model} config has the keys "
            f"{sorted(known)}{also}. The file was edited or belongs to another model. {loads}"
        )
    values = {k: v for k, v in fields.items() if k in known}
    if prepare is not None:
        prepare(values, source)
    check_config(values, schema, source)
    built = shape(**values)
    problems = buildable(built) if buildable is not None else []
    if problems:
        raise CheckpointError(
            f"{source}: isoprobe cannot build this {schema.model}: {'; '.join(problems)}. {loads}"
        )
    return built


def rising_levels(levels: Any) -> bool:
    """Whether ``levels`` are quantile levels a head can have: a non-empty list of numbers in
    (0, 1), strictly rising."""
    return (
        isinstance(levels, list)
        and bool(levels)
        and all(isinstance(q, (int, float)) and not isinstance(q, bool) for q in levels)
        and all(0 < q < 1 for q in levels)
        and levels == sorted(set(levels))
    )


def check_model_type(
    config: Mapping[str, Any], model_type: str, model: str, source: str, loads: str
) -> None:
    """Refuse a checkpoint's config.json (read from ``source``) whose ``model_type`` is not
    ``model_type``, naming the one it has."""
    found = config.get("model_type")
    if found != model_type:
        raise CheckpointError(
            f"{source}/config.json is not a {model} config (model_type={found!r}, expected "
            f"{model_type!r}). {loads}"
        )


def check_pretrained_config(source: str, schema: ConfigSchema) -> None:
    """Check the config.json of a Hugging Face checkpoint (a local directory, or a hub id's
    cached or downloaded file) against ``schema``, before transformers reads it."""
    from transformers.utils import cached_file

    try:
        path = cached_file(source, "config.json", _raise_exceptions_for_missing_entries=False)
    except OSError:
        return  # transformers' own reading names what is wrong (pretrained_config)
    if path is not None:
        check_config(read_json_config(Path(path)), schema, f"{source}/config.json")
