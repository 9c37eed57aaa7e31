"""Nothing a user sees of the probe changes by accident: the runs of
``tests/fixtures/probe_baseline/record.py`` (the default run with W&B, ``task=probe`` of every
model), recorded before the probe's redesign, give the same CSV rows, summary and logged keys
now, to float noise; only the keys and columns listed here as new may be added."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "probe_baseline"
RTOL = 1e-5
#: what the redesign adds: the probe's step index, logged beside its epoch
NEW_KEYS = {"probe/step", "rank/step"}
NEW_COLUMNS = {"step"}
ROW_KEY = ("probe", "epoch", "global_step", "layer", "metric")


def _record_module():
    spec = importlib.util.spec_from_file_location("probe_baseline_record", FIXTURE / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORD = _record_module()


def _rows(path: Path) -> tuple[list[str], dict[tuple, dict[str, str]]]:
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        rows = {tuple(row[k] for k in ROW_KEY): row for row in reader}
        return list(reader.fieldnames), rows


def _close(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-12)


def _same_numbers(expected, got, where: str) -> None:
    if isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), where
        for key, value in expected.items():
            _same_numbers(value, got[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(expected, got, strict=True)):
            _same_numbers(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) or isinstance(got, float):
        assert _close(float(expected), float(got)), f"{where}: {got} != {expected}"
    else:
        assert got == expected, where


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECORD.RUNS))
def test_a_recorded_run_gives_the_same_rows_summary_and_keys(tmp_path, name):
    expected_dir = FIXTURE / name
    found = RECORD.run(name, tmp_path)

    for file in RECORD.CSV_FILES:
        assert (tmp_path / file).is_file() == (expected_dir / file).is_file(), file
        if not (expected_dir / file).is_file():
            continue
        columns, expected = _rows(expected_dir / file)
        new_columns, got = _rows(tmp_path / file)
        assert (
            new_columns[: len(columns)] == columns
            and set(new_columns[len(columns) :]) <= NEW_COLUMNS
        )
        assert list(got) == list(expected), f"{file}: other rows or another order"
        for key, row in expected.items():
            assert got[key]["note"] == row["note"], (file, key)
            assert _close(float(row["value"]), float(got[key]["value"])), (file, key)

    _same_numbers(json.loads((expected_dir / "summary.json").read_text()), found["summary"], name)

    keys = set(json.loads((expected_dir / "keys.json").read_text()))
    assert keys <= set(found["keys"]), sorted(keys - set(found["keys"]))
    assert set(found["keys"]) - keys <= NEW_KEYS, sorted(set(found["keys"]) - keys - NEW_KEYS)
