"""``probe_metrics``: the configured metric set of one token matrix, sharing the centring, the
Gram matrix and the covariance spectrum between metrics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

import torch
from torch import Tensor

from isoprobe.metrics._tokens import as_token_matrix, centre
from isoprobe.metrics.clustering import check_cluster_range, cluster_cosine_of_centred
from isoprobe.metrics.cosine import mean_pairwise_cosine
from isoprobe.metrics.gram import feature_gram
from isoprobe.metrics.rank import rank_from_singular_values
from isoprobe.metrics.spectrum import (
    covariance_eigenvalues,
    covariance_eigenvalues_from_uncentred,
    effective_dimension_from_eigenvalues,
    isoscore_from_eigenvalues,
    participation_ratio_from_eigenvalues,
    partition_ratio_from_eigenvectors,
)

#: Selectable metric name -> the output keys of :func:`probe_metrics` it produces.
#:
#: ``cos_inter``: ``inter_token_cosine(X)``; ``cos_inter_centered``: with ``center=True``;
#: ``cos_cluster``: ``cluster_adjusted_cosine`` -> value (``cos_cluster``), baseline
#: (``cos_cluster_baseline``), value - baseline (``cos_cluster_excess``), k (``n_clusters``) and
#: the best mean silhouette (``silhouette``); ``eff_dim``: ``effective_dimension`` at
#: ``ed_threshold``; ``participation_ratio``; ``partition_ratio`` -> ratio and
#: ``log_partition_ratio``; ``isoscore``; ``eps_rank_centred``: ``epsilon_rank`` of the centred X
#: at ``rank_eps``, the dimension of the tokens' spread around their mean (the rank probe's
#: ``rank_uncentred_eps<ε>`` is that of the tokens themselves, mean included).
ALL_METRICS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "cos_inter": ("cos_inter",),
        "cos_inter_centered": ("cos_inter_centered",),
        "cos_cluster": (
            "cos_cluster",
            "cos_cluster_baseline",
            "cos_cluster_excess",
            "n_clusters",
            "silhouette",
        ),
        "eff_dim": ("eff_dim",),
        "participation_ratio": ("participation_ratio",),
        "partition_ratio": ("partition_ratio", "log_partition_ratio"),
        "isoscore": ("isoscore",),
        "eps_rank_centred": ("eps_rank_centred",),
    }
)
_FROM_COVARIANCE = {"eff_dim", "participation_ratio", "isoscore", "eps_rank_centred"}
#: former metric names -> their names now
RENAMED_METRICS: Mapping[str, str] = MappingProxyType({"eps_rank": "eps_rank_centred"})


@dataclass(frozen=True)
class ProbeMetricsConfig:
    """Which metrics :func:`probe_metrics` computes (names of :data:`ALL_METRICS`) and their
    parameters: the k-means sweep ``k_min``..``k_max``, ``min_silhouette`` and ``seed`` of the
    cluster-adjusted cosine, the effective dimension's ``ed_threshold`` and the centred ε-rank's
    ``rank_eps``."""

    metrics: tuple[str, ...] = tuple(ALL_METRICS)
    k_min: int = 2
    k_max: int = 16
    min_silhouette: float = 0.1
    seed: int = 0
    ed_threshold: float = 0.8
    rank_eps: float = 1e-2

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", tuple(self.metrics))
        if not self.metrics:
            raise ValueError(
                f"no probe metric chosen (metrics=[]); choose from {list(ALL_METRICS)}, or "
                "turn the probe off with callbacks=none"
            )
        renamed = {m: RENAMED_METRICS[m] for m in self.metrics if m in RENAMED_METRICS}
        if renamed:
            raise ValueError(
                f"probe metrics {list(renamed)} were renamed: write {list(renamed.values())} "
                "in callbacks.isotropy.metrics.metrics"
            )
        unknown = [m for m in self.metrics if m not in ALL_METRICS]
        if unknown:
            raise ValueError(f"unknown probe metrics {unknown}; choose from {list(ALL_METRICS)}")
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


def _spectral_metrics(
    X: Tensor, centred: Tensor, chosen: set[str], cfg: ProbeMetricsConfig
) -> dict[str, float]:
    """The metrics of :func:`probe_metrics` that come from C^T C of the centred rows C.

    With the partition ratio, one eigendecomposition of X^T X = C^T C + N·mean·meanᵀ serves
    both: its eigenvectors are the partition ratio's candidates, and the covariance spectrum
    follows from it by a rank-one downdate (a second dense eigendecomposition only where the
    common offset is too large for that)."""
    out: dict[str, float] = {}
    n = X.shape[0]
    gram = feature_gram(centred)
    eigenvalues = None
    if "partition_ratio" in chosen:
        mean = X.mean(dim=0)
        values, vectors = torch.linalg.eigh(gram + n * mean[:, None] * mean[None, :])
        ratio = partition_ratio_from_eigenvectors(X, vectors)
        out["partition_ratio"] = ratio.ratio
        out["log_partition_ratio"] = ratio.log_ratio
        if chosen & _FROM_COVARIANCE:
            eigenvalues = covariance_eigenvalues_from_uncentred(values, vectors, mean, n)
    if chosen & _FROM_COVARIANCE:
        if eigenvalues is None:
            eigenvalues = covariance_eigenvalues(gram, n)
        if "eff_dim" in chosen:
            out["eff_dim"] = effective_dimension_from_eigenvalues(eigenvalues, cfg.ed_threshold)
        if "participation_ratio" in chosen:
            out["participation_ratio"] = participation_ratio_from_eigenvalues(eigenvalues)
        if "isoscore" in chosen:
            out["isoscore"] = isoscore_from_eigenvalues(eigenvalues)
        if "eps_rank_centred" in chosen:
            # singular values of the centred X are sqrt((N - 1) lambda): same ratios
            out["eps_rank_centred"] = rank_from_singular_values(eigenvalues.sqrt(), cfg.rank_eps)
    return out


def probe_metrics(X: Tensor, cfg: ProbeMetricsConfig | Mapping | None = None) -> dict[str, float]:
    """The configured metrics of the token matrix X [N, D] as a flat dict of floats (ints as
    floats; NaN where a metric is undefined), keys as listed in :data:`ALL_METRICS`.

    X is validated and centred once; the Gram matrix of the centred rows serves the k-means
    sweep and, turned into distances, the silhouettes; C^T C of the centred rows plus
    N·mean·meanᵀ is the X^T X whose eigendecomposition gives the partition ratio's candidates
    and, by a rank-one downdate, the covariance spectrum (effective dimension, participation
    ratio, IsoScore, ε-rank). Everything runs on the caller's thread
    with torch's threads: on a CPU the stages are large matrix products that use every core,
    so running the clustering and the spectrum side by side only makes them compete.
    """
    cfg = ProbeMetricsConfig.from_any(cfg)
    X = as_token_matrix(X)
    chosen = set(cfg.metrics)
    centred = centre(X)
    out: dict[str, float] = {}
    if "cos_inter" in chosen:
        out["cos_inter"] = mean_pairwise_cosine(X)
    if "cos_inter_centered" in chosen:
        out["cos_inter_centered"] = mean_pairwise_cosine(centred)
    if "cos_cluster" in chosen:
        clusters = cluster_cosine_of_centred(
            centred, cfg.k_min, cfg.k_max, cfg.min_silhouette, cfg.seed
        )
        out.update(
            cos_cluster=clusters.value,
            cos_cluster_baseline=clusters.baseline,
            cos_cluster_excess=clusters.excess,
            n_clusters=clusters.k,
            silhouette=clusters.silhouette,
        )
    if chosen & (_FROM_COVARIANCE | {"partition_ratio"}):
        out.update(_spectral_metrics(X, centred, chosen, cfg))
    return {key: float(value) for key, value in out.items()}


__all__ = ["ALL_METRICS", "ProbeMetricsConfig", "probe_metrics"]
