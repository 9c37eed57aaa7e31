"""What a measure set hands back from one probed epoch: :class:`Row` values and the
:class:`Measurement` that holds them with whatever the set draws from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Row:
    """One measured value: ``metric`` of ``layer`` (``note`` says why when it failed)."""

    layer: str
    metric: str
    value: float
    note: str = ""


@dataclass
class Measurement:
    """What a probe's ``measure`` returns: the rows, and whatever the probe draws from."""

    rows: list[Row]
    artefacts: Any = None
