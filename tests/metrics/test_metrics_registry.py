"""The measure registry: selection by name or ``all``, refusals that name the known measures,
and a measure registered outside isoprobe.metrics running like the built-in ones."""

from __future__ import annotations

import pytest

from isoprobe.metrics import (
    ALL_METRICS,
    ProbeMetricsConfig,
    Tokens,
    measure_tokens,
    probe_metrics,
    register_measure,
    unregister_measure,
)

BUILT_IN = [
    "cos_inter",
    "cos_inter_centered",
    "cos_cluster",
    "eff_dim",
    "participation_ratio",
    "partition_ratio",
    "isoscore",
    "eps_rank_centred",
]


@pytest.fixture
def mean_norm():
    """A measure registered by a test: the norm of the mean token."""

    @register_measure("mean_norm")
    def _mean_norm(tokens: Tokens) -> dict[str, float]:
        return {"mean_norm": float(tokens.mean.norm())}

    yield _mean_norm
    unregister_measure("mean_norm")


def test_all_is_every_registered_measure_in_registration_order(gaussian, mean_norm):
    assert list(ALL_METRICS)[: len(BUILT_IN)] == BUILT_IN
    assert ProbeMetricsConfig().metrics == ProbeMetricsConfig(metrics="all").metrics
    assert ProbeMetricsConfig().metrics == (*BUILT_IN, "mean_norm")
    X = gaussian(50, 4) + 3
    out = probe_metrics(X)
    assert list(out) == [key for keys in ALL_METRICS.values() for key in keys]
    assert out["mean_norm"] == pytest.approx(float(X.double().mean(0).norm()), rel=1e-12)
    assert probe_metrics(X, {"metrics": "mean_norm"}) == {"mean_norm": out["mean_norm"]}


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(
        ValueError, match=r"unknown probe metrics \['isotropy'\]; choose from"
    ) as err:
        ProbeMetricsConfig(metrics=["cos_inter", "isotropy"])
    assert all(name in str(err.value) for name in BUILT_IN) and "'all'" in str(err.value)


def test_a_taken_name_or_key_is_refused(mean_norm):
    with pytest.raises(ValueError, match="'eff_dim' is taken"):
        register_measure("eff_dim")(mean_norm)
    with pytest.raises(ValueError, match=r"already produced by other measures: \['silhouette'\]"):
        register_measure("my_silhouette", ("silhouette",))(mean_norm)
    with pytest.raises(ValueError, match="'all' is taken"):
        register_measure("all")(mean_norm)
    assert "my_silhouette" not in ALL_METRICS


def test_a_measure_must_return_the_keys_it_was_registered_with(gaussian):
    @register_measure("two_keys", ("first_key", "second_key"))
    def _two_keys(tokens: Tokens) -> dict[str, float]:
        return {"first_key": 1.0}

    try:
        with pytest.raises(RuntimeError, match=r"'two_keys' returned keys \['first_key'\]"):
            measure_tokens(Tokens(gaussian(10, 3), {"metrics": ["two_keys"]}))
    finally:
        unregister_measure("two_keys")
