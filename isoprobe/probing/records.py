"""The probe's local record ``probe_metrics.csv``: one row per epoch x layer x metric.

The file is always rewritten whole, atomically (temp file, fsync, rename), so a crash leaves
either the previous complete file or the new one. A file already at the path that holds rows
the run does not (another run's, or epochs a resumed run is about to recompute) is never
overwritten: it is moved aside first.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COLUMNS = ("probe", "epoch", "global_step", "layer", "metric", "value", "note")
DEFAULT_PROBE = "isotropy"


_KEY = ("epoch", "global_step", "layer", "metric")


def make_record(
    epoch: int,
    global_step: int,
    layer: str,
    metric: str,
    value: float,
    note: str = "",
    *,
    probe: str = DEFAULT_PROBE,
) -> dict[str, Any]:
    return {
        "probe": probe,
        "epoch": int(epoch),
        "global_step": int(global_step),
        "layer": layer,
        "metric": metric,
        "value": float(value),
        "note": note,
    }


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``probe_metrics.csv`` with their types back (int epochs, float values)."""
    with path.open(newline="") as f:
        return [
            make_record(
                int(row["epoch"]),
                int(row["global_step"]),
                row["layer"],
                row["metric"],
                float(row["value"]),
                row.get("note") or "",
                probe=row.get("probe") or DEFAULT_PROBE,
            )
            for row in csv.DictReader(f)
        ]


def _same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _covers(records: Iterable[Mapping[str, Any]], existing: Iterable[Mapping[str, Any]]) -> bool:
    """Whether every existing row is among ``records`` with the same value."""
    values = {tuple(r[k] for k in _KEY): float(r["value"]) for r in records}
    for row in existing:
        key = tuple(row[k] for k in _KEY)
        if key not in values or not _same_value(values[key], row["value"]):
            return False
    return True


def _aside_name(path: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.stem}.replaced-{stamp}{path.suffix}")
    index = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}.replaced-{stamp}-{index}{path.suffix}")
        index += 1
    return candidate


def keep_foreign_file(path: Path, records: list[Mapping[str, Any]]) -> Path | None:
    """Move ``path`` aside (returning where) if it holds rows not among ``records``.

    Called before a run's first write: a file the run's records cover (its own earlier epochs,
    e.g. before a resume) is simply rewritten; anything else is kept, never overwritten.
    """
    if not path.exists():
        return None
    try:
        existing = read_records(path)
    except (KeyError, ValueError, csv.Error) as err:
        log.warning("the probe: %s is not a probe record (%s); keeping it aside", path, err)
        existing = None
    if existing is not None and _covers(records, existing):
        return None
    aside = _aside_name(path)
    os.replace(path, aside)
    log.warning(
        "the probe: %s held probe rows this run does not have (another run, or epochs a "
        "resumed run recomputes); moved it to %s and writing this run's full record",
        path,
        aside,
    )
    return aside


def write_records(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    """Write all ``records`` to ``path`` atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
