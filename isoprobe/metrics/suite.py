"""The isotropy probe's measures of one token matrix, registered by name
(:mod:`isoprobe.metrics.registry`), and :func:`probe_metrics`, which runs the chosen ones on
one :class:`Tokens`, so that the centring, the Gram matrix, the covariance spectrum and the
clustering are computed once for all of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import cached_property
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from isoprobe.metrics._tokens import as_token_matrix, centre
from isoprobe.metrics.clustering import (
    ClusterCosine,
    check_cluster_range,
    cluster_cosine_of_centred,
)
from isoprobe.metrics.cosine import mean_pairwise_cosine
from isoprobe.metrics.gram import feature_gram
from isoprobe.metrics.rank import rank_from_singular_values
from isoprobe.metrics.registry import (
    ALL,
    ALL_METRICS,
    MEASURES,
    MetricInfo,
    describe_metric,
    register_measure,
    selected_measures,
)
from isoprobe.metrics.spectrum import (
    covariance_eigenvalues,
    covariance_eigenvalues_from_uncentred,
    effective_dimension_from_eigenvalues,
    isoscore_from_eigenvalues,
    participation_ratio_from_eigenvalues,
    partition_ratio_from_eigenvectors,
)


@dataclass(frozen=True)
class ProbeMetricsConfig:
    """Which measures :func:`probe_metrics` runs (``"all"``, the default: every registered one;
    or names of :data:`ALL_METRICS`) and their parameters: the k-means sweep
    ``k_min``..``k_max``, ``min_silhouette`` and ``seed`` of the cluster-adjusted cosine, the
    effective dimension's ``ed_threshold`` and the centred ε-rank's ``rank_eps``, which the
    built-in measures share; ``params``: name -> the options of a chosen measure registered
    with a ``params`` dataclass (a plug-in's own parameters). Once built, ``metrics`` holds the
    chosen names and ``params`` each such measure's parameters."""

    metrics: str | Sequence[str] = ALL
    k_min: int = 2
    k_max: int = 16
    min_silhouette: float = 0.1
    seed: int = 0
    ed_threshold: float = 0.8
    rank_eps: float = 1e-2
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        chosen = selected_measures(self.metrics)
        object.__setattr__(self, "metrics", chosen)
        options = dict(self.params or {})
        unchosen = sorted(set(options) - set(chosen))
        if unchosen:
            raise ValueError(
                f"callbacks.probe.isotropy.metrics.params names {unchosen}, which are not among "
                f"the chosen measures {list(chosen)}"
            )
        built = {
            name: MEASURES[name].parameters(
                options.get(name), f"callbacks.probe.isotropy.metrics.params.{name}"
            )
            for name in chosen
            if MEASURES[name].params is not None
        }
        object.__setattr__(self, "params", MappingProxyType(built))
        check_cluster_range(self.k_min, self.k_max)
        if not 0 < self.ed_threshold <= 1:
            raise ValueError(f"ed_threshold must lie in (0, 1], got {self.ed_threshold}")
        if not 0 < self.rank_eps <= 1:
            raise ValueError(f"rank_eps must lie in (0, 1], got {self.rank_eps}")

    @classmethod
    def from_any(cls, cfg: ProbeMetricsConfig | Mapping | None) -> ProbeMetricsConfig:
        """A config from None (the defaults), a config, or a mapping of its fields (a plain
        dict or a Hydra ``DictConfig``)."""
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        if not isinstance(cfg, Mapping):
            raise TypeError(
                f"probe metrics config must be a ProbeMetricsConfig or a mapping, got {type(cfg)}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - known)
        if unknown:
            raise ValueError(f"unknown probe metric options {unknown}; known: {sorted(known)}")
        return cls(**dict(cfg))


class Tokens:
    """One layer's token matrix and what the measures share, each computed on first use.

    Attributes:
        X: the tokens [N, D], validated float64 (a ValueError names what is wrong).
        cfg: the probe's :class:`ProbeMetricsConfig` (which measures run, their parameters).

    X is centred once; the feature Gram matrix C^T C of the centred rows C plus N·mean·meanᵀ is
    the X^T X whose eigendecomposition gives the partition ratio's candidates and, by a rank-one
    downdate, the covariance spectrum (a dense eigendecomposition of C^T C only where the
    partition ratio is not measured). Everything runs on the caller's thread with torch's
    threads: on a CPU the stages are large matrix products that use every core, so running the
    clustering and the spectrum side by side only makes them compete.
    """

    def __init__(self, X: Tensor, cfg: ProbeMetricsConfig | None = None) -> None:
        self.X = as_token_matrix(X)
        self.cfg = ProbeMetricsConfig.from_any(cfg)

    @property
    def n(self) -> int:
        return self.X.shape[0]

    @cached_property
    def centred(self) -> Tensor:
        return centre(self.X)

    @cached_property
    def mean(self) -> Tensor:
        return self.X.mean(dim=0)

    @cached_property
    def gram(self) -> Tensor:
        """C^T C [D, D] of the centred rows C."""
        return feature_gram(self.centred)

    @cached_property
    def uncentred_eigh(self) -> tuple[Tensor, Tensor]:
        """Eigenvalues and eigenvectors of X^T X = C^T C + N·mean·meanᵀ."""
        mean = self.mean
        return torch.linalg.eigh(self.gram + self.n * mean[:, None] * mean[None, :])

    @cached_property
    def eigenvalues(self) -> Tensor:
        """The covariance eigenvalues (descending): by a rank-one downdate of X^T X's
        eigendecomposition where the partition ratio computes that anyway, else (or where the
        common offset is too large for the downdate) from C^T C."""
        if "partition_ratio" in self.cfg.metrics:
            values, vectors = self.uncentred_eigh
            downdated = covariance_eigenvalues_from_uncentred(values, vectors, self.mean, self.n)
            if downdated is not None:
                return downdated
        return covariance_eigenvalues(self.gram, self.n)

    @cached_property
    def clusters(self) -> ClusterCosine:
        """The cluster-adjusted cosine with its clustering (k-means labels, k, silhouette)."""
        cfg = self.cfg
        return cluster_cosine_of_centred(
            self.centred, cfg.k_min, cfg.k_max, cfg.min_silhouette, cfg.seed
        )


def measure_tokens(tokens: Tokens) -> dict[str, float]:
    """The chosen measures of ``tokens`` (``tokens.cfg.metrics``) as a flat dict of floats in
    registration order (ints as floats; NaN where a measure is undefined)."""
    chosen, params = set(tokens.cfg.metrics), tokens.cfg.params
    out: dict[str, float] = {}
    for name in ALL_METRICS:
        if name in chosen:
            out.update(MEASURES[name](tokens, params=params.get(name)))
    return out


def probe_metrics(X: Tensor, cfg: ProbeMetricsConfig | Mapping | None = None) -> dict[str, float]:
    """The configured measures of the token matrix X [N, D] (:func:`measure_tokens` of
    ``Tokens(X, cfg)``), keys as listed in :data:`ALL_METRICS`."""
    return measure_tokens(Tokens(X, ProbeMetricsConfig.from_any(cfg)))


#: the rows a probe measured a layer on (after masking and subsampling)
describe_metric("n_tokens", MetricInfo(bookkeeping=True))


@register_measure("cos_inter", info=MetricInfo(direction=-1, summary=True, shown=True))
def _cos_inter(tokens: Tokens) -> dict[str, float]:
    """Mean cosine over all token pairs, :func:`isoprobe.metrics.inter_token_cosine`."""
    return {"cos_inter": mean_pairwise_cosine(tokens.X)}


@register_measure("cos_inter_centered", info=MetricInfo(direction=-1, shown=True))
def _cos_inter_centered(tokens: Tokens) -> dict[str, float]:
    """The same after subtracting the mean token (``center=True``)."""
    return {"cos_inter_centered": mean_pairwise_cosine(tokens.centred)}


@register_measure(
    "cos_cluster",
    ("cos_cluster", "cos_cluster_baseline", "cos_cluster_excess", "n_clusters", "silhouette"),
    info={
        "cos_cluster": MetricInfo(direction=-1),
        "cos_cluster_excess": MetricInfo(summary=True, shown=True),
        "silhouette": MetricInfo(shown=True),
    },
)
def _cos_cluster(tokens: Tokens) -> dict[str, float]:
    """:func:`isoprobe.metrics.cluster_adjusted_cosine`: the value, its baseline, value -
    baseline, k and the best mean silhouette."""
    clusters = tokens.clusters
    return {
        "cos_cluster": clusters.value,
        "cos_cluster_baseline": clusters.baseline,
        "cos_cluster_excess": clusters.excess,
        "n_clusters": clusters.k,
        "silhouette": clusters.silhouette,
    }


@register_measure("eff_dim", info=MetricInfo(direction=1, summary=True, shown=True))
def _eff_dim(tokens: Tokens) -> dict[str, float]:
    """:func:`isoprobe.metrics.effective_dimension` at ``ed_threshold``."""
    return {
        "eff_dim": effective_dimension_from_eigenvalues(tokens.eigenvalues, tokens.cfg.ed_threshold)
    }


@register_measure("participation_ratio", info=MetricInfo(direction=1, shown=True))
def _participation_ratio(tokens: Tokens) -> dict[str, float]:
    """:func:`isoprobe.metrics.participation_ratio`."""
    return {"participation_ratio": participation_ratio_from_eigenvalues(tokens.eigenvalues)}


@register_measure(
    "partition_ratio",
    ("partition_ratio", "log_partition_ratio"),
    info={
        # spans tens of decades across layers
        "partition_ratio": MetricInfo(direction=1, summary=True, log_scale=True),
        "log_partition_ratio": MetricInfo(direction=1, shown=True),
    },
)
def _partition_ratio(tokens: Tokens) -> dict[str, float]:
    """:func:`isoprobe.metrics.partition_ratio`: the ratio and its log."""
    ratio = partition_ratio_from_eigenvectors(tokens.X, tokens.uncentred_eigh[1])
    return {"partition_ratio": ratio.ratio, "log_partition_ratio": ratio.log_ratio}


@register_measure("isoscore", info=MetricInfo(direction=1, summary=True, shown=True))
def _isoscore(tokens: Tokens) -> dict[str, float]:
    """:func:`isoprobe.metrics.isoscore`."""
    return {"isoscore": isoscore_from_eigenvalues(tokens.eigenvalues)}


@register_measure("eps_rank_centred", info=MetricInfo(direction=1))
def _eps_rank_centred(tokens: Tokens) -> dict[str, float]:
    """:func:`isoprobe.metrics.epsilon_rank` of the centred X at ``rank_eps``: the dimension of
    the tokens' spread around their mean (the rank probe's ``rank_uncentred_eps<ε>`` is that of
    the tokens themselves, mean included)."""
    # singular values of the centred X are sqrt((N - 1) lambda): same ratios
    rank = rank_from_singular_values(tokens.eigenvalues.sqrt(), tokens.cfg.rank_eps)
    return {"eps_rank_centred": rank}


__all__ = ["ALL_METRICS", "ProbeMetricsConfig", "Tokens", "measure_tokens", "probe_metrics"]
