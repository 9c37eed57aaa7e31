"""Whether two runs' probe records agree: the same rows (probe, step, layer, metric) and values
within a tolerance, as one process and DDP must on the same weights.

Prints the number of rows, the largest absolute and relative difference and the row where the
relative one is largest; exits 1 where rows differ or a value is off by more than ``--rtol``
relative (``--atol`` absolute for values near 0).

Run: ``.venv/bin/python bench/probe_tables_agree.py RUN_ONE RUN_TWO [--rtol 1e-5]``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from isoprobe.probing.records import read_records

KEY = ("probe", "global_step", "layer", "metric")


def values(run: Path) -> dict[tuple, float]:
    """A run's ``probe_metrics.csv`` as {(probe, step, layer, metric): value}."""
    return {
        tuple(r[k] for k in KEY): float(r["value"]) for r in read_records(run / "probe_metrics.csv")
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("one", type=Path)
    parser.add_argument("two", type=Path)
    parser.add_argument("--rtol", type=float, default=1e-5)
    parser.add_argument("--atol", type=float, default=1e-8)
    args = parser.parse_args()
    one, two = values(args.one), values(args.two)
    if one.keys() != two.keys() or not one:
        print(
            f"rows differ: {len(one)} against {len(two)}, {len(one.keys() ^ two.keys())} unmatched"
        )
        return 1
    worst_abs, worst_rel, worst_row = 0.0, 0.0, None
    for row, a in one.items():
        b = two[row]
        if math.isnan(a) and math.isnan(b):
            continue
        diff = abs(a - b)
        rel = math.inf if math.isnan(diff) else diff / max(abs(a), abs(b), args.atol)
        worst_abs = max(worst_abs, diff)
        if rel > worst_rel:
            worst_rel, worst_row = rel, row
    agree = worst_rel <= args.rtol
    print(
        f"{len(one)} probe rows; largest difference {worst_abs:.3g} absolute, {worst_rel:.3g} "
        f"relative (at {worst_row}); {'agree' if agree else 'DISAGREE'} within rtol {args.rtol:g}"
    )
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
