"""A Chronos-T5 checkpoint's ``chronos_config`` read as data: its keys are exactly
``ChronosConfig``'s fields, its ``tokenizer_class`` is one of the tokenizers isoprobe supports
(chronos-forecasting looks the name up in its module and calls what it finds) with that
tokenizer's arguments, and anything else is a :class:`CheckpointError` naming where the fields
came from, what is wrong and what is expected."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from chronos import ChronosConfig

from isoprobe.models.checkpoints import CheckpointError

#: tokenizer_class -> the arguments its constructor takes from ``tokenizer_kwargs``
TOKENIZERS: dict[str, tuple[str, ...]] = {"MeanScaleUniformBins": ("low_limit", "high_limit")}

FIELDS = tuple(field.name for field in dataclasses.fields(ChronosConfig))
#: the fields whose values are counts or ids, flags, and real numbers
INTEGERS = tuple(f.name for f in dataclasses.fields(ChronosConfig) if f.type is int)
FLAGS = tuple(f.name for f in dataclasses.fields(ChronosConfig) if f.type is bool)
REALS = tuple(f.name for f in dataclasses.fields(ChronosConfig) if f.type is float)


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def chronos_config(fields: Any, where: str) -> ChronosConfig:
    """The :class:`ChronosConfig` of ``fields`` (the ``chronos_config`` found at ``where``: a
    config.json or the settings of a scratch model), or an error naming what does not fit."""
    if not isinstance(fields, Mapping):
        raise CheckpointError(
            f"chronos_config in {where} is a {type(fields).__name__}, not an object with the "
            f"fields {list(FIELDS)}. Export the checkpoint again."
        )
    unexpected = sorted(set(fields) - set(FIELDS))
    missing = [name for name in FIELDS if name not in fields]
    if unexpected or missing:
        raise CheckpointError(
            f"chronos_config in {where} has unexpected keys {unexpected} and lacks {missing}; "
            f"a Chronos-T5 chronos_config has exactly the keys {list(FIELDS)}. The file was "
            "edited or belongs to another model: export the checkpoint again."
        )
    tokenizer = fields["tokenizer_class"]
    if not isinstance(tokenizer, str) or tokenizer not in TOKENIZERS:
        raise CheckpointError(
            f"chronos_config.tokenizer_class in {where} is {tokenizer!r}; isoprobe supports "
            f"{sorted(TOKENIZERS)}. The file was edited or belongs to another model."
        )
    arguments = fields["tokenizer_kwargs"]
    expected = TOKENIZERS[tokenizer]
    if not isinstance(arguments, Mapping) or sorted(arguments) != sorted(expected):
        raise CheckpointError(
            f"chronos_config.tokenizer_kwargs in {where} is {arguments!r}; {tokenizer} takes "
            f"exactly {list(expected)}. The file was edited or belongs to another model."
        )
    wrong = [
        f"{name}={fields[name]!r}"
        for names, fits in (
            (INTEGERS, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
            (FLAGS, lambda v: isinstance(v, bool)),
            (REALS, _is_real),
            (("model_type",), lambda v: v == "seq2seq"),
            (("tokenizer_kwargs",), lambda v: all(_is_real(x) for x in v.values())),
        )
        for name in names
        if not fits(fields[name])
    ]
    if wrong:
        raise CheckpointError(
            f"chronos_config in {where} has values of the wrong kind: {', '.join(wrong)} "
            f"(counts and ids are integers >= 0, {list(FLAGS)} true or false, {list(REALS)} and "
            "the tokenizer's limits finite numbers, model_type 'seq2seq'). The file was edited "
            "or belongs to another model."
        )
    try:
        return ChronosConfig(**fields)
    except AssertionError as err:
        raise CheckpointError(f"chronos_config in {where} does not hold together: {err}") from None
