"""Geometry of hidden representations: pure functions on torch tensors; their plain definitions
are in :mod:`isoprobe.metrics.reference`.

No Lightning, no logging, no I/O; float64 on the input's device.
"""

from isoprobe.metrics.clustering import ClusterCosine, cluster_adjusted_cosine
from isoprobe.metrics.cosine import inter_token_cosine
from isoprobe.metrics.kmeans import kmeans_sweep
from isoprobe.metrics.rank import epsilon_rank, singular_values
from isoprobe.metrics.readout import Readout, ridge_readout
from isoprobe.metrics.registry import (
    MEASURES,
    MetricInfo,
    describe_metric,
    metric_info,
    metrics_where,
    register_measure,
    unregister_measure,
)
from isoprobe.metrics.silhouette import silhouette_scores
from isoprobe.metrics.similarity import CkaSide, linear_cka
from isoprobe.metrics.spectrum import (
    PartitionRatio,
    effective_dimension,
    isoscore,
    participation_ratio,
    partition_ratio,
)
from isoprobe.metrics.suite import (
    ALL_METRICS,
    ProbeMetricsConfig,
    Tokens,
    measure_tokens,
    probe_metrics,
)

__all__ = [
    "ALL_METRICS",
    "MEASURES",
    "MetricInfo",
    "CkaSide",
    "ClusterCosine",
    "PartitionRatio",
    "Readout",
    "ProbeMetricsConfig",
    "Tokens",
    "cluster_adjusted_cosine",
    "describe_metric",
    "effective_dimension",
    "epsilon_rank",
    "inter_token_cosine",
    "isoscore",
    "kmeans_sweep",
    "linear_cka",
    "measure_tokens",
    "metric_info",
    "metrics_where",
    "participation_ratio",
    "partition_ratio",
    "probe_metrics",
    "register_measure",
    "ridge_readout",
    "silhouette_scores",
    "singular_values",
    "unregister_measure",
]
