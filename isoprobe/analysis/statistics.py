"""Rank association between a geometry metric and a forecast error, many tests at once.

For one group of runs, ``x`` holds one column per test (a metric at a layer choice) and ``y``
one column per test too (the forecast metric each test is paired with); rows are runs, and NaN
marks a run a test lacks. Every statistic is vectorised over the tests:

- Spearman's ρ: the Pearson correlation of the average ranks (scipy's ``rankdata``);
- a percentile bootstrap interval for ρ: ``n_boot`` resamples of the runs (the same resamples
  for every test, drawn from a seeded generator), each test's ρ recomputed on every resample
  as one array operation;
- a two-sided permutation p-value: ρ recomputed under ``n_perm`` random pairings of the runs,
  ``p = (1 + #{|ρ_perm| >= |ρ|}) / (1 + n_perm)`` (never 0, as an exact test's p is not);
- Kendall's τ-b from the signs of all pairs, as one array operation per run (equal to
  scipy's ``kendalltau``, which the tests check);
- Benjamini–Hochberg q-values over every defined test of a table (scipy's
  ``false_discovery_control``).

A test is *undefined* when ρ is: fewer than :data:`MIN_RUNS` complete runs, or a metric or a
forecast that is constant over them (all ties). An undefined test says nothing, so it gets no
τ, no interval and no p-value (and so no q-value and no place in the correction), and
:attr:`Association.undefined` says why. An interval is reported only when ρ is defined on at
least :data:`MIN_DEFINED_RESAMPLES` of the bootstrap resamples: the percentiles over the
resamples that remain are conditioned on the resample not being constant, and past a few
percent that condition is no longer negligible (a metric with two values among four runs is
constant in one resample in eight).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import gammaln

#: fewer runs than this in a group give no statistics (a rank correlation of 3 points takes
#: only the values ±1 and ±0.5)
MIN_RUNS = 4
#: the share of bootstrap resamples on which ρ must be defined for an interval to be reported
MIN_DEFINED_RESAMPLES = 0.95
#: why a test has no statistics (:attr:`Association.undefined`; "" where it has them)
TOO_FEW_RUNS = f"fewer than {MIN_RUNS} runs"
CONSTANT_METRIC = "constant metric"
CONSTANT_FORECAST = "constant forecast"


@dataclass(frozen=True)
class Association:
    """Per test (arrays of one value each): runs used, ρ, its interval, τ, p, and why a test
    has none of them (``""`` where it is defined)."""

    n: np.ndarray
    spearman: np.ndarray
    spearman_lo: np.ndarray
    spearman_hi: np.ndarray
    kendall: np.ndarray
    p_value: np.ndarray
    undefined: np.ndarray


def _pearson_columns(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of matching columns of ``a`` and ``b`` along axis -2 (rows are
    observations); a constant column gives NaN."""
    a = a - a.mean(axis=-2, keepdims=True)
    b = b - b.mean(axis=-2, keepdims=True)
    denominator = np.sqrt((a * a).sum(axis=-2) * (b * b).sum(axis=-2))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (a * b).sum(axis=-2) / denominator, np.nan)


def spearman_columns(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ of matching columns of complete ``x`` and ``y`` [..., n, tests]."""
    return _pearson_columns(stats.rankdata(x, axis=-2), stats.rankdata(y, axis=-2))


def kendall_columns(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's τ-b of matching columns of complete ``x`` and ``y`` [n, tests] (``y`` may be
    one shared column): over the pairs i < j, ``Σ s_x s_y / sqrt(U_x U_y)`` with
    ``s = sign(v_i - v_j)`` and ``U`` the number of pairs not tied in that variable
    (``n(n-1)/2 - Σ_ties t(t-1)/2``). The sum of sign products is accumulated one row i at a
    time on dense ranks in float32 (exact: ranks and signs are small integers), as one matrix
    product per row when ``y`` is shared."""
    rx, ry = _dense_ranks(x), _dense_ranks(y)
    concordance = np.zeros(x.shape[1])
    # the operands are finite small integers, so the products are exact; the BLAS kernel can
    # still raise a spurious invalid-value flag on column slices, which says nothing here
    with np.errstate(invalid="ignore"):
        for i in range(x.shape[0] - 1):
            sx = np.sign(rx[i] - rx[i + 1 :])
            sy = np.sign(ry[i] - ry[i + 1 :])
            concordance += sy[:, 0] @ sx if ry.shape[1] == 1 else (sx * sy).sum(axis=0)
    denominator = np.sqrt(_untied_pairs(rx) * _untied_pairs(ry))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, concordance / denominator, np.nan)


def _dense_ranks(v: np.ndarray) -> np.ndarray:
    """Per column, 0 for the smallest value, 1 for the next distinct one, ... (float32)."""
    return (stats.rankdata(v, method="dense", axis=0) - 1).astype(np.float32)


def _untied_pairs(ranks: np.ndarray) -> np.ndarray:
    """Per column, the pairs whose values differ: n(n-1)/2 minus Σ over tied groups."""
    n = ranks.shape[0]
    tied = np.zeros(ranks.shape[1])
    for j in range(ranks.shape[1]):
        counts = np.bincount(ranks[:, j].astype(np.int64))
        tied[j] = (counts * (counts - 1) / 2).sum()
    return n * (n - 1) / 2 - tied


def associate(
    x: np.ndarray, y: np.ndarray, n_boot: int = 1000, n_perm: int = 1000, seed: int = 0
) -> Association:
    """Every statistic of the module docstring for the tests (columns) of ``x`` and ``y``
    [runs, tests]; ``y`` may be one column [runs, 1] that every test shares, which saves its
    repeated ranks and signs. Undefined tests (module docstring) get NaN and their reason, and
    so do the interval when ``n_boot`` is 0 and the p-value when ``n_perm`` is 0."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    tests = x.shape[1]
    complete = np.isfinite(x) & np.isfinite(y)
    n = complete.sum(axis=0)
    out = {k: np.full(tests, np.nan) for k in ("rho", "lo", "hi", "tau", "p")}
    undefined = np.full(tests, TOO_FEW_RUNS, dtype=object)
    rng = np.random.default_rng(seed)
    # tests that share the same complete runs are computed together
    patterns: dict[bytes, list[int]] = {}
    for j in np.flatnonzero(n >= MIN_RUNS):
        patterns.setdefault(complete[:, j].tobytes(), []).append(int(j))
    for columns in patterns.values():
        rows = complete[:, columns[0]]
        xs = x[rows][:, columns]
        ys = y[rows] if y.shape[1] == 1 else y[rows][:, columns]
        why = _why_undefined(xs, ys)
        undefined[columns] = why
        defined = [c for c, reason in zip(columns, why, strict=True) if not reason]
        if not defined:
            continue
        keep = why == ""
        xs, ys = xs[:, keep], (ys if ys.shape[1] == 1 else ys[:, keep])
        rho = spearman_columns(xs, ys)
        out["rho"][defined] = rho
        out["tau"][defined] = kendall_columns(xs, ys)
        if n_boot:
            out["lo"][defined], out["hi"][defined] = _bootstrap_interval(xs, ys, n_boot, rng)
        if n_perm:
            out["p"][defined] = _permutation_p(xs, ys, rho, n_perm, rng)
    return Association(n, out["rho"], out["lo"], out["hi"], out["tau"], out["p"], undefined)


def _why_undefined(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per column of complete ``x`` and ``y`` [n, tests] (``y`` may be one shared column):
    :data:`CONSTANT_METRIC`, :data:`CONSTANT_FORECAST`, or ``""`` where ρ is defined."""
    constant_x = (x == x[:1]).all(axis=0)
    constant_y = np.broadcast_to((y == y[:1]).all(axis=0), constant_x.shape)
    return np.where(constant_x, CONSTANT_METRIC, np.where(constant_y, CONSTANT_FORECAST, ""))


def _bootstrap_interval(
    x: np.ndarray, y: np.ndarray, n_boot: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The 2.5% and 97.5% percentiles of ρ over ``n_boot`` resamples of the rows. A resample
    in which a column is constant has no ρ and is left out of that column's percentiles; a
    column defined on fewer than :data:`MIN_DEFINED_RESAMPLES` of them gets no interval."""
    runs = x.shape[0]
    chunk = max(1, int(2e7 // x.size))  # resamples at a time: about 160 MB per array
    draws = []
    for start in range(0, n_boot, chunk):
        index = rng.integers(0, runs, size=(min(chunk, n_boot - start), runs))
        draws.append(spearman_columns(x[index], y[index]))
    rhos = np.concatenate(draws)
    enough = np.isfinite(rhos).mean(axis=0) >= MIN_DEFINED_RESAMPLES
    lo, hi = np.full(rhos.shape[1], np.nan), np.full(rhos.shape[1], np.nan)
    if enough.any():
        lo[enough], hi[enough] = np.nanpercentile(rhos[:, enough], [2.5, 97.5], axis=0)
    return lo, hi


def _permutation_p(
    x: np.ndarray, y: np.ndarray, rho: np.ndarray, n_perm: int, rng: np.random.Generator
) -> np.ndarray:
    """Two-sided permutation p-value of a defined ρ: ``y``'s ranks re-paired at random with
    ``x``'s. Tied ranks stay tied under every pairing, so the reference distribution is that
    of the observed ties; the 1e-12 tolerance counts a permuted ρ equal to the observed one
    (the same ties give the same value up to rounding) as extreme. A re-pairing leaves each
    column's centred ranks and their norms as they were, so ρ under it is one product of the
    re-paired ``y`` ranks with the ``x`` ranks (a matrix product when ``y`` is shared), and the
    pairings are drawn and counted a chunk at a time: memory stays bounded whatever
    ``n_perm``."""
    centre = (x.shape[0] + 1) / 2
    rx, ry = stats.rankdata(x, axis=0) - centre, stats.rankdata(y, axis=0) - centre
    scale = np.sqrt((rx * rx).sum(axis=0) * (ry * ry).sum(axis=0))
    threshold = np.abs(rho) - 1e-12
    chunk = max(1, int(2e7 // x.size))  # pairings at a time
    extreme = np.zeros(x.shape[1])
    for start in range(0, n_perm, chunk):
        order = np.argsort(rng.random((min(chunk, n_perm - start), x.shape[0])), axis=1)
        if ry.shape[1] == 1:
            products = ry[order, 0] @ rx
        else:
            products = np.einsum("pnt,nt->pt", ry[order], rx)
        extreme += (np.abs(products / scale) >= threshold).sum(axis=0)
    return (1 + extreme) / (1 + n_perm)


def q_values(p: np.ndarray) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values of the finite entries of ``p`` (NaN stays NaN)."""
    p = np.asarray(p, dtype=float)
    q = np.full_like(p, np.nan)
    finite = np.isfinite(p)
    if finite.any():
        q[finite] = stats.false_discovery_control(p[finite], method="bh")
    return q


class Stratified(NamedTuple):
    """Per test of :func:`stratified_spearman`: the combined ρ, its p, the runs of the strata
    that counted, and ``log Π n_s!`` over them (the pairings its permutations draw from)."""

    spearman: np.ndarray
    p_value: np.ndarray
    n: np.ndarray
    log_pairings: np.ndarray


def stratified_spearman(
    x: np.ndarray, y: np.ndarray, strata: np.ndarray, n_perm: int = 1000, seed: int = 0
) -> Stratified:
    """Spearman's ρ inside each stratum (a model, a data set, a run) of ``x`` [runs, tests]
    against ``y`` [runs] (``strata`` [runs] labels), combined as the mean weighted by the
    stratum's runs n_s (van Elteren's idea for rank tests), over the strata where the test has
    at least :data:`MIN_RUNS` complete runs and neither side is constant; p from ``n_perm``
    permutations of ``y`` inside each stratum (two-sided, (1 + hits) / (1 + n_perm)); NaN where
    no stratum counts. Pooling runs of different models in one ρ mixes the between-model
    difference (one model is both more isotropic and better) with the within-model association;
    the stratified ρ keeps only the latter."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    strata = np.asarray(strata)
    tests = x.shape[1]
    rng = np.random.default_rng(seed)
    numerator, weight, log_pairings = np.zeros(tests), np.zeros(tests), np.zeros(tests)
    permuted = np.zeros((n_perm, tests))
    for stratum in pd.unique(strata):
        rows = (strata == stratum) & np.isfinite(y)
        xs, ys = x[rows], y[rows]
        n = len(ys)
        usable = np.isfinite(xs).all(axis=0) & (n >= MIN_RUNS)
        if not usable.any():
            continue
        rx = _standard(stats.rankdata(xs[:, usable], axis=0))
        ry = _standard(stats.rankdata(ys)[:, None])[:, 0]
        defined = np.isfinite(rx).all(axis=0) & bool(np.isfinite(ry).all())
        columns = np.flatnonzero(usable)[defined]
        if not len(columns):
            continue
        rx = rx[:, defined]
        numerator[columns] += rx.T @ ry
        weight[columns] += n
        log_pairings[columns] += gammaln(n + 1.0)
        if n_perm:
            shuffled = ry[np.argsort(rng.random((n_perm, n)), axis=1)]
            permuted[:, columns] += shuffled @ rx
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(weight > 0, numerator / weight, np.nan)
        null = permuted / weight
    hits = (np.abs(null) >= np.abs(rho) - 1e-12).sum(axis=0)
    p = (
        np.where(weight > 0, (1 + hits) / (1 + n_perm), np.nan)
        if n_perm
        else np.full(tests, np.nan)
    )
    return Stratified(rho, p, weight.astype(int), log_pairings)


def _standard(ranks: np.ndarray) -> np.ndarray:
    """Columns centred and scaled so that the mean product of two is their Pearson ρ (NaN for
    a constant column)."""
    centred = ranks - ranks.mean(axis=0)
    scale = np.sqrt((centred * centred).mean(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(scale > 0, centred / scale, np.nan)
