"""The vectorised statistics against scipy's own, on constructed tables."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from isoprobe.analysis.statistics import MIN_RUNS, associate, q_values, spearman_columns


def table(runs: int = 12, tests: int = 5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Columns with ties (rounded values) and associations of every strength."""
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(runs, 1)).repeat(tests, axis=1)
    noise = rng.normal(size=(runs, tests)) * np.linspace(0.1, 3, tests)
    return np.round(y + noise, 1), y


def test_spearman_equals_scipy_with_ties():
    x, y = table()
    expected = [stats.spearmanr(x[:, j], y[:, j]).statistic for j in range(x.shape[1])]
    np.testing.assert_allclose(spearman_columns(x, y), expected, rtol=0, atol=1e-12)


def test_kendall_and_n_equal_scipy_on_the_complete_runs():
    x, y = table()
    x[[1, 4], 0] = np.nan
    y[7, 2] = np.nan
    found = associate(x, y, n_boot=0, n_perm=0)
    for j in range(x.shape[1]):
        ok = np.isfinite(x[:, j]) & np.isfinite(y[:, j])
        assert found.n[j] == ok.sum()
        assert found.spearman[j] == pytest.approx(stats.spearmanr(x[ok, j], y[ok, j]).statistic)
        assert found.kendall[j] == pytest.approx(stats.kendalltau(x[ok, j], y[ok, j]).statistic)


def test_bootstrap_interval_equals_a_loop_over_the_same_resamples():
    x, y = table(runs=9, tests=3)
    found = associate(x, y, n_boot=300, n_perm=0, seed=5)
    rng = np.random.default_rng(5)
    index = np.concatenate([rng.integers(0, 9, size=(200, 9)), rng.integers(0, 9, size=(100, 9))])
    for j in range(3):
        rhos = [stats.spearmanr(x[i, j], y[i, j]).statistic for i in index]
        lo, hi = np.nanpercentile(rhos, [2.5, 97.5])
        assert (found.spearman_lo[j], found.spearman_hi[j]) == pytest.approx((lo, hi))


def test_bootstrap_interval_agrees_with_scipy_bootstrap():
    rng = np.random.default_rng(1)
    y = rng.normal(size=40)
    x = y + rng.normal(size=40)
    found = associate(x[:, None], y[:, None], n_boot=4000, n_perm=0, seed=2)
    reference = stats.bootstrap(
        (x, y),
        lambda a, b, axis: spearman_columns(
            np.moveaxis(a, axis, -1)[..., None], np.moveaxis(b, axis, -1)[..., None]
        )[..., 0],
        paired=True,
        vectorized=True,
        n_resamples=4000,
        method="percentile",
        rng=np.random.default_rng(3),
    ).confidence_interval
    assert found.spearman_lo[0] == pytest.approx(reference.low, abs=0.03)
    assert found.spearman_hi[0] == pytest.approx(reference.high, abs=0.03)


def test_permutation_p_agrees_with_scipys_exact_test():
    x, y = table(runs=6, tests=3, seed=4)
    found = associate(x, y, n_boot=0, n_perm=20000, seed=0)
    for j in range(3):
        exact = stats.permutation_test(
            (x[:, j],),
            lambda a, target=y[:, j]: stats.spearmanr(a, target).statistic,
            permutation_type="pairings",
            alternative="two-sided",
        ).pvalue
        assert found.p_value[j] == pytest.approx(exact, abs=0.015)


def test_a_perfect_association_of_four_runs_has_p_of_two_orderings_in_24():
    x = np.arange(4.0)[:, None]
    found = associate(x, x * 3, n_boot=0, n_perm=50000, seed=0)
    assert found.spearman[0] == 1.0
    assert found.p_value[0] == pytest.approx(2 / 24, abs=0.005)


def test_fewer_than_min_runs_give_no_statistics():
    x = np.arange(MIN_RUNS - 1.0)[:, None]
    found = associate(x, x, n_boot=10, n_perm=10)
    assert found.n[0] == MIN_RUNS - 1
    assert np.isnan(
        [found.spearman[0], found.spearman_lo[0], found.kendall[0], found.p_value[0]]
    ).all()


def test_q_values_are_benjamini_hochberg():
    p = np.array([0.01, 0.04, np.nan, 0.03, 0.2, 0.005])
    finite = p[np.isfinite(p)]
    order = np.argsort(finite)
    m = len(finite)
    adjusted = finite[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum.accumulate(adjusted[::-1])[::-1]
    expected = np.empty(m)
    expected[order] = np.minimum(adjusted, 1)
    q = q_values(p)
    assert np.isnan(q[2])
    np.testing.assert_allclose(q[np.isfinite(p)], expected)


def test_one_shared_column_of_y_equals_it_repeated():
    x, y = table()
    shared = associate(x, y[:, :1], n_boot=200, n_perm=200, seed=3)
    repeated = associate(x, y, n_boot=200, n_perm=200, seed=3)
    for name in ("n", "spearman", "spearman_lo", "spearman_hi", "kendall", "p_value"):
        np.testing.assert_allclose(getattr(shared, name), getattr(repeated, name))
