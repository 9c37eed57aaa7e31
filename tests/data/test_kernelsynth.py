"""KernelSynth: the right Gaussian-process covariances, seeding, the disk cache, the configs."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hydra.utils import instantiate
from sklearn.gaussian_process.kernels import RBF, DotProduct, ExpSineSquared

from isoprobe.data import dataset_spec, load_series
from isoprobe.data import kernelsynth as ks
from tests.conftest import data_config


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path, monkeypatch):
    """Every test caches under its own tmp folder, never in ~/.cache."""
    monkeypatch.setenv("ISOPROBE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def grid(length: int) -> np.ndarray:
    return np.linspace(0, 1, length)[:, None]


def assert_covariance(samples: np.ndarray, cov: np.ndarray, sigmas: float = 6.0) -> None:
    """The zero-mean samples' second moment matches ``cov`` entrywise within ``sigmas`` standard
    errors (the standard error of a Gaussian product moment is sqrt((K_ii K_jj + K_ij^2) / n))."""
    n = len(samples)
    empirical = samples.T @ samples / n
    stderr = np.sqrt((np.outer(cov.diagonal(), cov.diagonal()) + cov**2) / n)
    excess = np.abs(empirical - cov) - sigmas * stderr
    assert excess.max() <= 1e-12 * np.abs(cov).max(), f"worst excess {excess.max():.3g}"


def test_same_seed_gives_the_same_series_and_another_seed_others():
    a = ks.generate("mixed", 40, length=64, seed=3, progress=False)
    b = ks.generate("mixed", 40, length=64, seed=3, progress=False)
    c = ks.generate("mixed", 40, length=64, seed=4, progress=False)
    assert a.shape == (40, 64) and a.dtype == np.float64 and np.isfinite(a).all()
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_product_terms_add_up_to_the_composed_sklearn_kernel():
    bank = ks.kernel_bank(48)
    x = grid(48)
    matrices = [k(x) for k in bank]
    compositions = ks.draw_compositions(np.random.default_rng(0), 200, len(bank))
    assert {len(c[0]) for c in compositions} == {1, 2, 3, 4, 5}
    for composition in compositions:
        terms = ks.product_terms(composition)
        total = sum(np.prod([matrices[i] for i in term], axis=0) for term in terms)
        expected = ks.compose_kernel(bank, composition)(x)
        np.testing.assert_allclose(total, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ks.SINGLE_SETS)
def test_single_kernel_sets_have_their_kernels_covariance(name):
    length = 24
    samples = ks.generate(name, 20_000, length=length, seed=1, progress=False)
    assert_covariance(samples, ks.single_kernel(name, length)(grid(length)))


@pytest.mark.parametrize(
    "composition",
    [
        # (RBF(0.1) x ESS(24) + C) x RBF(0.1): a squared factor, C dropped from a product
        ((24, 0, 32, 24), (True, False, True)),
        ((31, 25, 23), (True, False)),  # White(1) x RBF(1) + DotProduct(10): a diagonal term
        ((21, 21), (False,)),  # DotProduct(0) + DotProduct(0): the same term twice
        ((32, 32, 5), (True, False)),  # C x C + ESS(672): a product of all-ones factors only
        ((8, 27, 1, 29, 12), (True, True, False, True)),  # five kernels
    ],
)
def test_mixed_series_have_their_compositions_covariance(composition):
    length = 20
    bank = ks.kernel_bank(length)
    rng = np.random.default_rng(2)
    samples = ks.sample_compositions(bank, [composition] * 20_000, length, rng, progress=False)
    assert_covariance(samples, ks.compose_kernel(bank, composition)(grid(length)))


def test_linear_1_series_are_lines_through_the_origin():
    samples = ks.generate("linear_1", 20, seed=5, progress=False)
    t = np.linspace(0, 1, ks.LENGTH)
    slopes = samples @ t / (t @ t)
    assert np.all(samples[:, 0] == 0)
    np.testing.assert_allclose(samples, np.outer(slopes, t), rtol=0, atol=1e-9)
    assert np.abs(slopes).min() > 0


@pytest.mark.parametrize("name, variance", [("stochastic_1", 0.1), ("stochastic_2", 1.0)])
def test_stochastic_series_are_white_noise_of_their_variance(name, variance):
    samples = ks.generate(name, 100, seed=6, progress=False)
    n = samples.size
    assert samples.var() == pytest.approx(variance, rel=6 * np.sqrt(2 / n))
    lag1 = (samples[:, 1:] * samples[:, :-1]).mean() / variance
    assert abs(lag1) < 6 / np.sqrt(n)


def test_covariance_factor_of_a_low_rank_and_a_full_rank_covariance():
    x = grid(300)
    low = RBF(1.0)(x) + DotProduct(sigma_0=1.0)(x)
    full = ExpSineSquared(periodicity=3 / 300)(x) + np.eye(300)
    for cov, low_rank in ((low, True), (full, False)):
        factor = ks.covariance_factor(cov)
        assert (factor.shape[1] < 50) == low_rank
        residual = cov - factor @ factor.T
        assert np.abs(residual).max() <= 1e-9 * cov.diagonal().max()


def test_cache_round_trip_reads_back_the_same_array(cache_in_tmp, monkeypatch):
    first = ks.cached_generate("mixed", 12, length=64, seed=2, progress=False)
    path = ks.cache_path("mixed", 12, 64, 2, cache_in_tmp)
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == [path.name]

    def no_generation(*args, **kwargs):
        raise AssertionError("the cache was not read")

    monkeypatch.setattr(ks, "generate", no_generation)
    np.testing.assert_array_equal(ks.cached_generate("mixed", 12, 64, 2, progress=False), first)


def test_an_interrupted_write_leaves_no_cache_and_a_stale_temp_file_is_ignored(
    cache_in_tmp, monkeypatch
):
    path = ks.cache_path("trend_1", 5, 64, 0, cache_in_tmp)

    def interrupted(src, dst):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", interrupted)
        with pytest.raises(KeyboardInterrupt):
            ks.cached_generate("trend_1", 5, 64, 0, progress=False)
    assert not path.exists() and list(path.parent.iterdir()) == []

    # a temp file a killed process left behind, holding a truncated array of the same name
    stale = path.parent / f".{path.name}.killed.tmp"
    stale.write_bytes(b"\x93NUMPY\x01\x00v\x00")
    data = ks.cached_generate("trend_1", 5, 64, 0, progress=False)
    np.testing.assert_array_equal(data, ks.generate("trend_1", 5, 64, 0, progress=False))
    np.testing.assert_array_equal(np.load(path), data)


def test_an_explicit_cache_dir_overrides_the_environment(cache_in_tmp, tmp_path):
    load_series("kernelsynth/nonlinear_1", num_series=3, length=64, cache_dir=str(tmp_path / "x"))
    assert ks.cache_path("nonlinear_1", 3, 64, 0, tmp_path / "x").is_file()
    assert not cache_in_tmp.exists()


def test_progress_bar_reports_generation(capsys):
    data = ks.generate("mixed", 30, length=32, seed=0, progress=True)
    assert data.shape == (30, 32)
    assert "KernelSynth mixed (30)" in capsys.readouterr().err


@pytest.mark.parametrize("name", ks.SETS)
def test_registered_sets_load_float64_series_with_their_windows(name):
    spec = dataset_spec(f"kernelsynth/{name}")
    assert spec.offline and spec.domain == "synthetic"
    expected = (128, 32) if name == "mixed" else (500, 64)
    assert (spec.context_length, spec.prediction_length) == expected
    collection = load_series(f"kernelsynth/{name}", num_series=3)
    assert len(collection.series) == 3 == len(collection.item_ids)
    assert all(s.dtype == np.float64 and s.shape == (ks.LENGTH,) for s in collection.series)
    assert collection.season_length == {"seasonality_1": 84, "seasonality_2": 6}.get(name, 1)


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="unknown KernelSynth set 'linear_3'.*linear_1"):
        ks.generate("linear_3", 5)
    with pytest.raises(ValueError, match="num_series must be a positive integer"):
        ks.generate("mixed", 0)
    with pytest.raises(ValueError, match="length must be an integer >= 2"):
        ks.generate("mixed", 5, length=1)


@pytest.mark.parametrize("name", ks.SETS)
def test_config_windows_every_segment(name):
    dm = instantiate(data_config(f"kernelsynth/{name}", seed=7, dataset_kwargs={"num_series": 2}))
    assert dm.dataset == f"kernelsynth/{name}"
    dm.setup("fit")
    assert min(dm.report["windows"].values()) > 0
    expected = (128, 32) if name == "mixed" else (500, 64)
    assert (dm.context_length, dm.prediction_length) == expected
    assert dm.collection.item_ids[0] == f"{name}-0"
