"""``probe_metrics``: the configured metric set on one token matrix, sharing the centring and the
covariance eigendecomposition between metrics."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

from torch import Tensor

from isoprobe.metrics._checks import as_token_matrix
from isoprobe.metrics.clustering import cluster_cosine_of_centred
from isoprobe.metrics.cosine import mean_pairwise_cosine
from isoprobe.metrics.rank import rank_from_singular_values
from isoprobe.metrics.spectrum import (
    covariance_eigh,
    effective_dimension_from_eigenvalues,
    isoscore_from_eigenvalues,
    participation_ratio_from_eigenvalues,
    partition_ratio,
)

# selectable name -> the output keys it produces
ALL_METRICS: dict[str, tuple[str, ...]] = {
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
    "eps_rank": ("eps_rank",),
}
_SPECTRAL = {"eff_dim", "participation_ratio", "isoscore", "eps_rank"}


@dataclass(frozen=True)
class ProbeMetricsConfig:
    """Which metrics to compute and their parameters (see METRICS.md)."""

    metrics: tuple[str, ...] = tuple(ALL_METRICS)
    k_min: int = 2
    k_max: int = 16
    min_silhouette: float = 0.1
    seed: int = 0
    ed_threshold: float = 0.8
    rank_eps: float = 1e-2

    def __post_init__(self) -> None:
        unknown = set(self.metrics) - set(ALL_METRICS)
        if unknown:
            raise ValueError(f"unknown probe metrics {sorted(unknown)}; known: {list(ALL_METRICS)}")

    @classmethod
    def from_any(cls, cfg: ProbeMetricsConfig | Mapping | None) -> ProbeMetricsConfig:
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        known = {f.name for f in fields(cls)}
        unknown = set(cfg) - known
        if unknown:
            raise ValueError(f"unknown probe metric options {sorted(unknown)}; known: {sorted(known)}")
        values = dict(cfg)
        if "metrics" in values:
            values["metrics"] = tuple(values["metrics"])
        return cls(**values)


def probe_metrics(
    X: Tensor, cfg: ProbeMetricsConfig | Mapping | None = None
) -> dict[str, float]:
    """Every configured metric of the token matrix X [N, D] as a flat dict of floats."""
    cfg = ProbeMetricsConfig.from_any(cfg)
    X = as_token_matrix(X)
    chosen = set(cfg.metrics)
    centred = X - X.mean(dim=0)
    out: dict[str, float] = {}
    if "cos_inter" in chosen:
        out["cos_inter"] = mean_pairwise_cosine(X)
    if "cos_inter_centered" in chosen:
        out["cos_inter_centered"] = mean_pairwise_cosine(centred)
    eigh = covariance_eigh(centred) if chosen & (_SPECTRAL | {"cos_cluster"}) else None
    if "cos_cluster" in chosen:
        cc = cluster_cosine_of_centred(
            centred, cfg.k_min, cfg.k_max, cfg.min_silhouette, cfg.seed, eigh
        )
        out.update(
            cos_cluster=cc.value,
            cos_cluster_baseline=cc.baseline,
            cos_cluster_excess=cc.excess,
            n_clusters=float(cc.k),
            silhouette=cc.silhouette,
        )
    if eigh is not None:
        eigenvalues = eigh[0]
        if "eff_dim" in chosen:
            out["eff_dim"] = float(effective_dimension_from_eigenvalues(eigenvalues, cfg.ed_threshold))
        if "participation_ratio" in chosen:
            out["participation_ratio"] = participation_ratio_from_eigenvalues(eigenvalues)
        if "isoscore" in chosen:
            out["isoscore"] = isoscore_from_eigenvalues(eigenvalues)
        if "eps_rank" in chosen:
            # singular values of the centred X are sqrt((N - 1) lambda): same ratios as sqrt(lambda)
            out["eps_rank"] = float(rank_from_singular_values(eigenvalues.sqrt(), cfg.rank_eps))
    if "partition_ratio" in chosen:
        pr = partition_ratio(X)
        out["partition_ratio"] = pr.ratio
        out["log_partition_ratio"] = pr.log_ratio
    return {k: (math.nan if v is None else float(v)) for k, v in out.items()}




__all__ = ["ALL_METRICS", "ProbeMetricsConfig", "probe_metrics"]
