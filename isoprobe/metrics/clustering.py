"""Cluster-adjusted inter-token cosine (isotropy paper eq. 6 and appendix D).

k-means (k-means++ seeding, Lloyd iterations) for every k in [k_min, k_max], the k with the
largest mean silhouette, and inside each cluster the mean cosine of centroid-subtracted members.
Silhouettes of all k are computed in one blocked pass over the pairwise distances, never
holding the N x N matrix, which is what makes this many times faster than running
``sklearn.metrics.silhouette_score`` once per k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from isoprobe.metrics._checks import as_token_matrix
from isoprobe.metrics.cosine import mean_pairwise_cosine
from isoprobe.metrics.spectrum import covariance_eigh

_BLOCK_ROWS = 1024


@dataclass(frozen=True)
class ClusterCosine:
    """Cluster-adjusted cosine ``value``, the chosen ``k`` and its mean ``silhouette``, per-row
    ``labels``, the sample-size ``baseline`` mean of -1/(n_c - 1) and the cluster ``sizes``."""

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


def _squared_distances(X: Tensor, C: Tensor, x_sq: Tensor) -> Tensor:
    return (x_sq[:, None] + C.square().sum(1)[None, :] - 2 * X @ C.T).clamp_min_(0)


def _kmeans_plus_plus(X: Tensor, x_sq: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """Greedy k-means++ seeding: of 2 + log k candidates drawn by D^2, keep the best."""
    n = X.shape[0]
    trials = 2 + int(math.log(k))
    first = int(torch.randint(n, (1,), generator=gen, device="cpu"))
    centres = [X[first]]
    closest = _squared_distances(X, X[first : first + 1], x_sq)[:, 0]
    for _ in range(1, k):
        total = closest.sum()
        if total <= 0:
            candidates = torch.randint(n, (trials,), generator=gen, device="cpu")
        else:
            probs = (closest / total).cpu()
            candidates = torch.multinomial(probs, trials, replacement=True, generator=gen)
        candidates = candidates.to(X.device)
        cand_dist = torch.minimum(closest[:, None], _squared_distances(X, X[candidates], x_sq))
        best = int(cand_dist.sum(0).argmin())
        centres.append(X[candidates[best]])
        closest = cand_dist[:, best]
    return torch.stack(centres)


def kmeans(
    X: Tensor, k: int, seed: int = 0, max_iter: int = 300, tol: float = 1e-4
) -> tuple[Tensor, float]:
    """Lloyd's k-means from k-means++ seeds; returns (labels [N], inertia).

    Stops when the centres move less than ``tol`` times the mean per-feature variance
    (squared), as scikit-learn does.
    """
    gen = torch.Generator().manual_seed(seed)
    x_sq = X.square().sum(1)
    centres = _kmeans_plus_plus(X, x_sq, k, gen)
    shift_tol = tol * float(x_sq.mean() - X.mean(0).square().sum()) / X.shape[1]
    for _ in range(max_iter):
        labels = _squared_distances(X, centres, x_sq).argmin(1)
        counts = torch.bincount(labels, minlength=k).to(X.dtype)
        sums = torch.zeros_like(centres).index_add_(0, labels, X)
        new = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centres)
        shift = float((new - centres).square().sum())
        centres = new
        if shift <= shift_tol:
            break
    dist = _squared_distances(X, centres, x_sq)
    labels = dist.argmin(1)
    return labels, float(dist.gather(1, labels[:, None]).sum())


def silhouettes(X: Tensor, labelings: list[Tensor]) -> list[float]:
    """Mean Euclidean silhouette of each labeling of the rows of X (Rousseeuw 1987).

    s(i) = (b - a) / max(a, b), a the mean distance to the own cluster's other members, b the
    smallest mean distance to another cluster; 0 for members of singleton clusters.
    """
    n = X.shape[0]
    ks = [int(lab.max()) + 1 for lab in labelings]
    onehot = torch.cat(
        [torch.nn.functional.one_hot(lab, k).to(X.dtype) for lab, k in zip(labelings, ks)], dim=1
    )
    offsets = [0, *torch.tensor(ks).cumsum(0).tolist()]
    counts = onehot.sum(0)
    x_sq = X.square().sum(1)
    totals = torch.zeros(len(labelings), dtype=torch.float64, device=X.device)
    for start in range(0, n, _BLOCK_ROWS):
        rows = slice(start, min(start + _BLOCK_ROWS, n))
        dist = _squared_distances(X[rows], X, x_sq[rows]).sqrt_()
        sums = dist @ onehot
        for j, (lab, k) in enumerate(zip(labelings, ks)):
            cluster_sums = sums[:, offsets[j] : offsets[j + 1]]
            sizes = counts[offsets[j] : offsets[j + 1]]
            own = lab[rows]
            own_size = sizes[own]
            a = cluster_sums.gather(1, own[:, None])[:, 0] / (own_size - 1).clamp_min(1)
            means = cluster_sums / sizes.clamp_min(1)
            means.scatter_(1, own[:, None], math.inf)
            means[:, sizes == 0] = math.inf
            b = means.min(1).values
            s = (b - a) / torch.maximum(a, b)
            s = torch.where((own_size > 1) & (torch.maximum(a, b) > 0), s, torch.zeros_like(s))
            totals[j] += s.sum(dtype=torch.float64)
    return (totals / n).tolist()


def _cosine_inside_clusters(X: Tensor, labels: Tensor) -> tuple[float, float, tuple[int, ...]]:
    k = int(labels.max()) + 1
    values, baselines, sizes = [], [], []
    for c in range(k):
        members = X[labels == c]
        sizes.append(members.shape[0])
        if members.shape[0] < 2:
            continue
        value = mean_pairwise_cosine(members - members.mean(dim=0))
        if not math.isnan(value):
            values.append(value)
            baselines.append(-1.0 / (members.shape[0] - 1))
    if not values:
        return math.nan, math.nan, tuple(sizes)
    return sum(values) / len(values), sum(baselines) / len(baselines), tuple(sizes)


def principal_coordinates(
    centred: Tensor, eigenvalues: Tensor, vectors: Tensor, keep_variance: float = 1 - 1e-7
) -> Tensor:
    """Rows in the basis of the leading principal axes holding ``keep_variance`` of the
    variance, as float32: pairwise distances change by at most the dropped variance, and
    clustering then costs O(N·d) per step instead of O(N·D) for anisotropic clouds (d << D)."""
    total = eigenvalues.sum()
    if total <= 0:
        return centred[:, :1].to(torch.float32)
    d = int((eigenvalues.cumsum(0) / total < keep_variance).sum()) + 1
    return (centred @ vectors[:, :d]).to(torch.float32)


def choose_clusters(
    centred: Tensor,
    k_min: int,
    k_max: int,
    min_silhouette: float,
    seed: int,
    eigh: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, int, float]:
    """k-means labels of the k in [k_min, k_max] with the best silhouette, or one cluster.

    Clustering runs on :func:`principal_coordinates` (``eigh`` = the covariance eigenvalues
    and vectors, descending, if already computed).
    """
    n = centred.shape[0]
    k_max = min(k_max, n - 1)
    candidates = list(range(max(k_min, 2), k_max + 1))
    one_cluster = torch.zeros(n, dtype=torch.long, device=centred.device)
    if not candidates:
        return one_cluster, 1, math.nan
    eigenvalues, vectors = eigh if eigh is not None else covariance_eigh(centred)
    coords = principal_coordinates(centred, eigenvalues, vectors)
    labelings = [kmeans(coords, k, seed=seed)[0] for k in candidates]
    scores = silhouettes(coords, labelings)
    best = max(range(len(candidates)), key=lambda i: scores[i])
    if scores[best] < min_silhouette:
        return one_cluster, 1, scores[best]
    return labelings[best], candidates[best], scores[best]


def cluster_cosine_of_centred(
    centred: Tensor,
    k_min: int,
    k_max: int,
    min_silhouette: float,
    seed: int,
    eigh: tuple[Tensor, Tensor] | None = None,
) -> ClusterCosine:
    """:func:`cluster_adjusted_cosine` on rows already centred globally and validated."""
    labels, k, silhouette = choose_clusters(centred, k_min, k_max, min_silhouette, seed, eigh)
    value, baseline, sizes = _cosine_inside_clusters(centred, labels)
    return ClusterCosine(value, k, silhouette, labels, baseline, sizes)


def cluster_adjusted_cosine(
    X: Tensor, k_min: int = 2, k_max: int = 16, min_silhouette: float = 0.1, seed: int = 0
) -> ClusterCosine:
    """Cluster-adjusted inter-token cosine (eq. 6): centre globally, cluster by k-means with
    the silhouette-best k (one cluster when that silhouette < ``min_silhouette``), subtract each
    centroid and average the clusters' inter-token cosines (clusters of >= 2 members,
    unweighted). Near 0 is isotropic; compare with ``baseline`` = mean of -1/(n_c - 1)."""
    X = as_token_matrix(X)
    return cluster_cosine_of_centred(X - X.mean(dim=0), k_min, k_max, min_silhouette, seed)
