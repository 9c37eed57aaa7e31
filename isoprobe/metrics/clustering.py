"""Cluster-adjusted inter-token cosine (isotropy paper eq. 6 and appendix D).

On the globally centred tokens: k-means for every k in [k_min, k_max], the k with the largest
mean silhouette (one cluster if that silhouette is below ``min_silhouette``), then inside each
cluster the mean cosine of the centroid-subtracted members, averaged over clusters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from isoprobe.metrics._tokens import as_token_matrix, centre
from isoprobe.metrics.gram import gram_matrix, pairwise_distances_
from isoprobe.metrics.kmeans import kmeans_sweep
from isoprobe.metrics.silhouette import silhouette_scores


@dataclass(frozen=True)
class ClusterCosine:
    """Result of :func:`cluster_adjusted_cosine`.

    ``value``: mean over clusters of the within-cluster inter-token cosine; ``k``: clusters
    used (1 when no k reached ``min_silhouette``); ``silhouette``: the best mean silhouette
    found (NaN when no k could be tried); ``labels``: cluster of each row [N]; ``baseline``:
    mean over the same clusters of -1/(n_c - 1), what ``value`` is for any cloud whose centred
    members have equal norms; ``sizes``: members per cluster.
    """

    value: float
    k: int
    silhouette: float
    labels: Tensor
    baseline: float
    sizes: tuple[int, ...]

    @property
    def excess(self) -> float:
        """``value - baseline``: the part of the cosine that is geometry, not sample size."""
        return self.value - self.baseline


def check_cluster_range(k_min: int, k_max: int) -> None:
    """ValueError unless 2 <= k_min <= k_max."""
    if not 2 <= k_min <= k_max:
        raise ValueError(
            f"need 2 <= k_min <= k_max for the k-means sweep, got k_min={k_min}, k_max={k_max}"
        )


def sweep_ks(n_rows: int, k_min: int, k_max: int) -> list[int]:
    """The k the sweep tries for N = ``n_rows``: k_min..min(k_max, N - 1), possibly none."""
    return list(range(k_min, min(k_max, n_rows - 1) + 1))


def choose_clusters(
    centred: Tensor,
    k_min: int,
    k_max: int,
    min_silhouette: float,
    seed: int,
) -> tuple[Tensor, int, float]:
    """(labels, k, silhouette) of the k in :func:`sweep_ks` whose k-means partition has the
    largest mean silhouette (the smallest such k on ties), or of one cluster when that
    silhouette is below ``min_silhouette`` or no k is possible. One N x N matrix serves both:
    the rows' Gram matrix for the k-means sweep, then, turned in place, their distances for
    the silhouettes."""
    n = centred.shape[0]
    ks = sweep_ks(n, k_min, k_max)
    one_cluster = torch.zeros(n, dtype=torch.long, device=centred.device)
    if not ks:
        return one_cluster, 1, math.nan
    gram = gram_matrix(centred)
    labels = kmeans_sweep(centred, ks, seed=seed, gram=gram)
    scores = silhouette_scores(centred, labels, distances=pairwise_distances_(gram))
    best = int(scores.argmax())
    silhouette = float(scores[best])
    if silhouette < min_silhouette:
        return one_cluster, 1, silhouette
    return labels[:, best].clone(), ks[best], silhouette


def within_cluster_cosines(centred: Tensor, labels: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per cluster: the mean pairwise cosine of its centroid-subtracted members (O(N·D), as
    :func:`~isoprobe.metrics.cosine.mean_pairwise_cosine`), and how many members of nonzero
    norm it averages over. Each cluster is shifted by one of its members before its mean is
    taken, so identical members subtract to exact zeros."""
    n, d = centred.shape
    rows = torch.arange(n, device=centred.device)
    first = torch.full((k,), n - 1, device=centred.device).scatter_reduce_(
        0, labels, rows, reduce="amin"
    )
    shifted = centred - centred[first][labels]
    counts = torch.bincount(labels, minlength=k).to(centred.dtype)
    sums = torch.zeros(k, d, dtype=centred.dtype, device=centred.device)
    residual = (
        shifted - (sums.index_add_(0, labels, shifted) / counts.clamp_min(1)[:, None])[labels]
    )
    norms = residual.norm(dim=1)
    keep = norms > 0
    units = residual.div_(norms.clamp_min(1e-300)[:, None])  # rows of zero norm stay zero
    unit_sums = torch.zeros(k, d, dtype=centred.dtype, device=centred.device)
    unit_sums.index_add_(0, labels, units)
    used = torch.bincount(labels, weights=keep.to(centred.dtype), minlength=k)
    cosines = (unit_sums.square().sum(1) - used) / (used * (used - 1)).clamp_min(1)
    return cosines, used


def cluster_cosine_of_centred(
    centred: Tensor,
    k_min: int,
    k_max: int,
    min_silhouette: float,
    seed: int,
) -> ClusterCosine:
    """:func:`cluster_adjusted_cosine` of validated, globally centred float64 rows."""
    check_cluster_range(k_min, k_max)
    labels, k, silhouette = choose_clusters(centred, k_min, k_max, min_silhouette, seed)
    cosines, used = within_cluster_cosines(centred, labels, k)
    sizes = tuple(torch.bincount(labels, minlength=k).tolist())
    measured = used >= 2
    if not bool(measured.any()):
        return ClusterCosine(math.nan, k, silhouette, labels, math.nan, sizes)
    value = float(cosines[measured].mean())
    baseline = float((-1.0 / (used[measured] - 1)).mean())
    return ClusterCosine(value, k, silhouette, labels, baseline, sizes)


def cluster_adjusted_cosine(
    X: Tensor, k_min: int = 2, k_max: int = 16, min_silhouette: float = 0.1, seed: int = 0
) -> ClusterCosine:
    """Cluster-adjusted inter-token cosine (isotropy paper eq. 6, appendix D).

    Centre X globally; k-means (k-means++ seeding from ``seed``) for every k in
    [k_min, k_max] (k_max lowered to N - 1 when N <= k_max); keep the k of the largest mean
    Euclidean silhouette, or one cluster when that is below ``min_silhouette``; inside each
    cluster subtract its centroid and take the mean inter-token cosine of its members of
    nonzero norm; ``value`` is the unweighted mean over clusters with at least two of them
    (NaN if none). Near 0 is isotropic; read it against ``baseline`` (docs/measures.md, "Reading the
    cluster-adjusted cosine").
    """
    X = as_token_matrix(X)
    return cluster_cosine_of_centred(centre(X), k_min, k_max, min_silhouette, seed)
