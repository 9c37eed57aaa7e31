"""What one family of tests holds: the declared question, the exploratory scan, and the tests
that belong to neither.

Every test of a table gets a ``family``:

- ``primary``: the papers' one question, declared before the runs are read (:class:`Question`):
  does the last layer's isotropy predict the forecast error, within a model? One test per model
  and one within-model test (ρ inside each model, combined), corrected together and apart from
  everything else.
- ``exploratory``: the scan of every other metric × layer × forecast metric × group; its
  Benjamini–Hochberg q-values are taken over these tests alone, and what it finds is a
  hypothesis for new runs.
- ``descriptive``: a test whose runs are too few for any outcome to reach the level: the
  smallest two-sided permutation p-value of ``n`` untied runs is ``2 / n!`` (the two orderings
  that agree or disagree completely, of ``n!``), 0.083 for 4 runs. Its ρ and interval describe
  the runs; it takes no place in a correction and is never a finding. For a test stratified into
  groups of ``n_s`` runs, permuted inside each, the smallest p is ``2 / Π n_s!``.
- ``repeat``: the same runs, the same metric values and the same forecast values as a test
  already counted (``final_*`` is ``after_*`` for runs that trained and ``before_*`` for those
  that did not; one model's group is the group ``all`` when a study has one model). It is
  counted once: the repeat names the test it repeats and has no q-value.
- ``undefined``: no answer at all (``undefined`` says why: too few runs, a constant side, runs
  that share weights).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import gammaln

from isoprobe.analysis.statistics import q_values

#: the significance level of findings, of the question's answer and of their confirmation
ALPHA = 0.05
PRIMARY, EXPLORATORY, DESCRIPTIVE, REPEAT, UNDEFINED = (
    "primary",
    "exploratory",
    "descriptive",
    "repeat",
    "undefined",
)
#: families whose tests are corrected (each on its own) and can be findings
CORRECTED = (PRIMARY, EXPLORATORY)
#: the group of the question's combined test: ρ inside each model, weighted by runs
WITHIN_MODEL = "within model"


@dataclass(frozen=True)
class Question:
    """The study's declared primary test: ``metric`` of the ``probe`` at ``layer`` against the
    ``forecast`` error, within each model (the papers' question with their choices: the
    isotropy probe's ``analyze.isotropy_metric`` at the last block, against the primary forecast
    metric)."""

    metric: str
    forecast: str
    layer: str = "last"
    probe: str = "isotropy"

    def asks(self, table: pd.DataFrame) -> np.ndarray:
        """Rows of a correlations table that are this question's tests (per model, and within
        model)."""
        group = table["group"].astype(str)
        return (
            (table["probe"] == self.probe)
            & (table["metric"] == self.metric)
            & (table["layer"] == self.layer)
            & (table["forecast_metric"] == self.forecast)
            & (group.str.startswith("model=") | (group == WITHIN_MODEL))
        ).to_numpy()

    def describe(self) -> str:
        return (
            f"does the {self.layer} layer's {self.metric} predict {self.forecast}, within a model?"
        )


def smallest_p(log_pairings: np.ndarray) -> np.ndarray:
    """The smallest two-sided permutation p-value a test can reach when it has
    ``exp(log_pairings)`` equally likely pairings: ``2 / pairings``."""
    return 2.0 * np.exp(-np.asarray(log_pairings, dtype=float))


def log_pairings_of(n: np.ndarray) -> np.ndarray:
    """``log n!``: the pairings of ``n`` runs (module docstring)."""
    return gammaln(np.asarray(n, dtype=float) + 1.0)


def sameness_key(rows: Sequence[Hashable], x: np.ndarray, y: np.ndarray, *extra: Hashable) -> tuple:
    """What makes two tests the same: the runs both sides are complete on, the values there,
    and whatever else the test depends on (``extra``: strata)."""
    keep = np.isfinite(x) & np.isfinite(y)
    runs = tuple(r for r, k in zip(rows, keep, strict=True) if k)
    return (runs, x[keep].tobytes(), y[keep].tobytes(), *extra)


def assign_families(
    table: pd.DataFrame,
    keys: Sequence[Hashable],
    primary: np.ndarray,
    log_pairings: np.ndarray,
    label: Sequence[str],
    alpha: float = ALPHA,
) -> pd.DataFrame:
    """``table`` (one row per test, with ``p_value`` and ``undefined``) with ``family``,
    ``repeats`` (the :data:`REPEAT`'s original, by ``label``) and ``q_value``: BH over the
    defined :data:`PRIMARY` tests, and apart over the :data:`EXPLORATORY` ones. ``keys`` say
    which tests are the same (:func:`sameness_key`); the first of equal tests is counted, primary
    tests before the others. ``log_pairings`` per test gives its smallest p
    (:func:`smallest_p`)."""
    table = table.copy()
    defined = table["undefined"].isna().to_numpy()
    primary = np.asarray(primary, dtype=bool)
    family = np.where(defined, np.where(primary, PRIMARY, EXPLORATORY), UNDEFINED).astype(object)
    repeats = np.full(len(table), None, dtype=object)
    first: dict[Hashable, int] = {}
    for i in np.argsort(~primary, kind="stable"):
        if not defined[i]:
            continue
        original = first.setdefault(keys[i], int(i))
        if original != i:
            family[i], repeats[i] = REPEAT, label[original]
    too_few = smallest_p(log_pairings) > alpha
    family[np.isin(family, CORRECTED) & too_few] = DESCRIPTIVE
    table["family"], table["repeats"] = family, repeats
    q = np.full(len(table), np.nan)
    p = table["p_value"].to_numpy(dtype=float)
    for name in CORRECTED:
        members = family == name
        q[members] = q_values(p[members])
    table["q_value"] = q
    return table


def findings(table: pd.DataFrame, alpha: float = ALPHA) -> pd.DataFrame:
    """The tests of the corrected families with q < ``alpha``."""
    return table[table["family"].isin(CORRECTED) & (table["q_value"] < alpha)]


def family_counts(table: pd.DataFrame) -> dict[str, int]:
    """Tests per family, every family named (0 where it has none)."""
    counts = table["family"].value_counts()
    return {
        name: int(counts.get(name, 0))
        for name in (PRIMARY, EXPLORATORY, DESCRIPTIVE, REPEAT, UNDEFINED)
    }
