"""Mean silhouette (Rousseeuw 1987) of many labelings in one pass over the pairwise distances."""

from __future__ import annotations

import math

import torch
from torch import Tensor

BLOCK_ROWS = 512


def _cluster_distance_sums(X: Tensor, onehot: Tensor, block_rows: int) -> Tensor:
    """S[i, c] = sum of ||x_i - x_j|| over the rows j with onehot[j, c] = 1.

    The N x N distances are never held at once: blocks of rows I <= J are computed once and
    serve both I (against J's memberships) and J (against I's).
    """
    n = X.shape[0]
    x_sq = X.square().sum(1)
    sums = torch.zeros(n, onehot.shape[1], dtype=X.dtype, device=X.device)
    for i in range(0, n, block_rows):
        rows_i = slice(i, i + block_rows)
        for j in range(i, n, block_rows):
            rows_j = slice(j, j + block_rows)
            dist = torch.addmm(x_sq[rows_i, None], X[rows_i], X[rows_j].T, alpha=-2)
            dist.add_(x_sq[None, rows_j]).clamp_min_(0).sqrt_()
            if i == j:
                dist.fill_diagonal_(0)
            sums[rows_i] += dist @ onehot[rows_j]
            if i != j:
                sums[rows_j] += dist.T @ onehot[rows_i]
    return sums


def silhouette_scores(
    X: Tensor, labels: Tensor, block_rows: int = BLOCK_ROWS, distances: Tensor | None = None
) -> Tensor:
    """Mean Euclidean silhouette of each column of ``labels`` [N, L] as a labeling of the rows
    of float64 X [N, D]; returns [L].

    s(i) = (b_i - a_i) / max(a_i, b_i), a_i the mean distance from x_i to the other members of
    its cluster, b_i the smallest mean distance to the members of another non-empty cluster;
    s(i) = 0 for a member of a singleton cluster (as scikit-learn) and where no other cluster
    has members. All labelings share one pass over the distances: they are stacked into one
    one-hot matrix [N, sum of k]. ``distances`` is the [N, N] matrix of pairwise distances if
    the caller has it (see :func:`~isoprobe.metrics.gram.pairwise_distances_`): then one matrix
    product gives every sum; without it, blocks of ``block_rows`` rows are computed and
    dropped, so that no N x N matrix is held.
    """
    n, n_labelings = labels.shape
    ks = labels.max(dim=0).values + 1
    offsets = torch.cumsum(ks, 0) - ks
    columns = labels + offsets[None, :]
    # zero columns up to a multiple of 16: matrix products of such widths run faster
    onehot = torch.zeros(n, -(-int(ks.sum()) // 16) * 16, dtype=X.dtype, device=X.device)
    onehot.scatter_(1, columns, 1.0)
    if distances is None:
        sums = _cluster_distance_sums(X, onehot, block_rows)
    else:
        sums = distances @ onehot
    counts = onehot.sum(0)

    own_count = counts[columns]
    a = sums.gather(1, columns) / (own_count - 1).clamp_min(1)
    width = int(ks.max())
    slot = torch.arange(width, device=X.device)
    padded = (offsets[:, None] + slot[None, :]).clamp_max(counts.numel() - 1)  # [L, width]
    means = (sums / counts.clamp_min(1))[:, padded]  # [N, L, width]
    excluded = (slot[None, :] >= ks[:, None]) | (counts[padded] == 0)
    means.masked_fill_(excluded[None], math.inf)
    means.scatter_(2, labels[:, :, None], math.inf)
    b = means.min(dim=2).values
    scale = torch.maximum(a, b)
    defined = (own_count > 1) & torch.isfinite(b) & (scale > 0)
    s = torch.where(defined, (b - a) / scale.clamp_min(torch.finfo(X.dtype).tiny), 0.0)
    return s.mean(dim=0)
