"""Read one run directory's files, or say in one sentence why they cannot be read in full.

Every reader raises :class:`UnreadableRun` with a reason that names the file, never a library's
error: :func:`isoprobe.analysis.study.load_study` leaves such a run out, lists it with that
reason, and goes on with the others. What is checked:

- ``.hydra/config.yaml`` and ``.hydra/overrides.yaml``: YAML read as plain data (a tag such as
  ``!!python/object/apply:...`` is refused, never constructed), a mapping (a list) that is not
  empty.
- ``summary.json``: JSON holding an object whose ``before`` / ``after`` are objects. A forecast
  metric that is not finite (``inf``, ``NaN``) is kept as missing and named
  (:class:`Forecasts`), so that the run is left out of that metric's tests with a reason.
- a probe file (``probe_metrics.csv``, ``rank_metrics.csv``): exactly the record columns, typed
  (integer epochs and steps, numeric values), ending with a line end (a file cut mid-row does
  not), and complete by the rule of :func:`check_complete`.
- ``csv/metrics.csv`` and ``compression.csv``: parsable CSV.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import yaml
from pyarrow import csv as pa_csv

from isoprobe.errors import IsoprobeError

#: libyaml's safe loader where PyYAML was built with it (ten times the pure-Python one)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: a probe record's columns (what the probe callbacks write)
RECORD = ("probe", "epoch", "global_step", "layer", "metric", "value", "note")
#: summary.json's count of rows the run wrote to each probe file (``task=*`` since issue 29)
PROMISED_ROWS = "probe_rows"
#: the metric of a row that says why a layer was not measured at that epoch
ERROR_METRIC = "error"
_TYPES = {
    "probe": pa.string(),
    "epoch": pa.int64(),
    "global_step": pa.int64(),
    "layer": pa.string(),
    "metric": pa.string(),
    "value": pa.float64(),
    "note": pa.string(),
}


class UnreadableRun(IsoprobeError, ValueError):
    """A run file that cannot be read in full; the message is the reason, naming the file."""


#: where a job of a sweep that failed leaves its error (isoprobe/tasks/sweep_job.py)
FAILED_FILE = "failed.json"


def read_failure(run: Path) -> str | None:
    """The error a failed job of a sweep left in ``run`` (None when it left none)."""
    try:
        return str(json.loads((run / FAILED_FILE).read_text())["error"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"its {FAILED_FILE} cannot be read ({err})"


def read_yaml(path: Path, kind: type, empty_ok: bool = False) -> Any:
    """The plain data of a YAML file that must hold a ``kind`` (dict or list), empty only when
    ``empty_ok``."""
    try:
        data = yaml.load(path.read_text(), Loader=SAFE_LOADER)
    except yaml.constructor.ConstructorError as err:
        tag = str(err.problem).rsplit("tag ", 1)[-1].strip("'\"")
        tag = tag.replace("tag:yaml.org,2002:", "!!")
        raise UnreadableRun(
            f"{path} holds the YAML tag {tag}, which is refused: a run's config is read as "
            "plain data, and a tag could make reading it run code"
        ) from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UnreadableRun(f"{path} is not valid YAML ({_first_line(err)})") from None
    if data is None and empty_ok:
        return kind()
    if not data and not empty_ok:
        raise UnreadableRun(f"{path} is empty")
    if not isinstance(data, kind):
        raise UnreadableRun(
            f"{path} holds a {type(data).__name__}, not a {kind.__name__} as run.py writes"
        )
    return data


def read_config(run: Path) -> dict[str, Any]:
    """The run's resolved config, ``.hydra/config.yaml``."""
    return read_yaml(run / ".hydra" / "config.yaml", dict)


def read_overrides(run: Path) -> dict[str, str]:
    """The run's command-line overrides (``.hydra/overrides.yaml``), Hydra's own left aside."""
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    items = read_yaml(path, list, empty_ok=True)
    pairs = (str(item).split("=", 1) for item in items if "=" in str(item))
    return {_override_name(key): value for key, value in pairs if not key.startswith("hydra")}


def _override_name(key: str) -> str:
    """The column an override is shown as: ``low_rank@model.low_rank`` -> ``low_rank``,
    ``+data.x`` -> ``data.x`` (the package and the add/force prefixes are not its name)."""
    return key.lstrip("+~").split("@", 1)[0]


@dataclass
class Forecasts:
    """A run's forecast metrics from ``summary.json`` (``before_test_nmse``: value), the ones
    that were not finite (kept out of ``metrics``: name -> the value as written), and the
    number of rows the run wrote to each probe file (empty for runs older than that count)."""

    metrics: dict[str, float] = field(default_factory=dict)
    not_finite: dict[str, float] = field(default_factory=dict)
    promised_rows: dict[str, int] = field(default_factory=dict)


def read_summary(run: Path) -> Forecasts:
    """The forecast metrics of ``summary.json`` (none when the run wrote no summary)."""
    path = run / "summary.json"
    if not path.is_file():
        return Forecasts()
    try:
        summary = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UnreadableRun(f"{path} is not valid JSON ({_first_line(err)})") from None
    if not isinstance(summary, dict):
        raise UnreadableRun(
            f"{path} holds a {type(summary).__name__}, not the run's summary (a JSON object "
            "with before/after)"
        )
    found = Forecasts()
    for when in ("before", "after"):
        part = summary.get(when) or {}
        if not isinstance(part, dict):
            raise UnreadableRun(f"{path}: {when!r} holds a {type(part).__name__}, not an object")
        for name, value in part.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                column = f"{when}_{name.replace('/', '_')}"
                if math.isfinite(value):
                    found.metrics[column] = float(value)
                else:
                    found.not_finite[column] = float(value)
    rows = summary.get(PROMISED_ROWS) or {}
    if isinstance(rows, dict):
        found.promised_rows = {
            str(k): v for k, v in rows.items() if isinstance(v, int) and not isinstance(v, bool)
        }
    return found


def read_probe_file(path: Path, promised: int | None = None) -> pa.Table:
    """The records of one probe file, checked (module docstring); ``promised`` is the number
    of rows the run wrote to it (summary.json), when the run recorded it."""
    with path.open("rb") as f:
        f.seek(0, 2)
        if f.tell() == 0:
            raise UnreadableRun(f"{path} is empty")
        f.seek(-1, 2)
        if f.read(1) != b"\n":
            raise UnreadableRun(f"{path} is cut mid-row (its last line has no line end)")
    options = pa_csv.ConvertOptions(column_types=_TYPES, strings_can_be_null=True)
    try:
        table = pa_csv.read_csv(path, convert_options=options)
    except (pa.ArrowException, UnicodeDecodeError) as err:
        raise UnreadableRun(f"{path} is not a probe record file ({_first_line(err)})") from None
    if sorted(table.column_names) != sorted(RECORD):
        raise UnreadableRun(
            f"{path} is not a probe record file: its columns are {table.column_names}, a "
            f"probe's are {list(RECORD)}"
        )
    table = table.select(list(RECORD))
    for column in ("probe", "epoch", "layer", "metric"):
        if table[column].null_count:
            raise UnreadableRun(f"{path} has rows without a {column}")
    if promised is not None and table.num_rows != promised:
        raise UnreadableRun(
            f"incomplete probe records: {path} holds {table.num_rows} rows, the run wrote "
            f"{promised} (summary.json's {PROMISED_ROWS})"
        )
    check_complete(path, table)
    return table


def check_complete(path: Path, table: pa.Table) -> None:
    """Refuse probe records whose last probe lacks a (layer, metric) of the first probe.

    A probe measures the same layers and metrics at every probe time and its file is written
    in step order, so a file cut at a row boundary loses rows of its last probe: per probe,
    every (layer, metric) measured at the first step must be in the last step too. A layer with
    an ``error`` row at the last probe (not measured then, the note says why) counts as
    present. A one-probe file cut at a layer boundary passes this rule; summary.json's count of
    the rows written (:func:`read_probe_file`'s ``promised``) catches it.
    """
    for probe in pc.unique(table["probe"]).to_pylist():
        part = table.filter(pc.equal(table["probe"], probe))
        steps = pc.min_max(part["global_step"])
        first, last = steps["min"].as_py(), steps["max"].as_py()
        if first == last:
            continue
        key = pc.binary_join_element_wise(part["layer"], part["metric"], "/")
        at_last = pc.equal(part["global_step"], last)
        is_error = pc.equal(part["metric"], ERROR_METRIC)
        failed = part["layer"].filter(pc.and_(at_last, is_error))
        wanted = pc.and_(pc.equal(part["global_step"], first), pc.invert(is_error))
        wanted = pc.and_(wanted, pc.invert(pc.is_in(part["layer"], value_set=failed)))
        expected = key.filter(wanted)
        missing = expected.filter(pc.invert(pc.is_in(expected, value_set=key.filter(at_last))))
        if len(missing):
            listed = ", ".join(missing[:3].to_pylist())
            raise UnreadableRun(
                f"incomplete probe records: {path}'s {probe} probe lacks {len(missing)} of the "
                f"first probe's layer/metric rows at its last probe, step {last} (e.g. {listed})"
            )


def read_csv(path: Path) -> pd.DataFrame:
    """A CSV a run wrote (``csv/metrics.csv``, ``compression.csv``)."""
    try:
        return pd.read_csv(path)
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as err:
        raise UnreadableRun(f"{path} is not a readable CSV file ({_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
