"""k-means for several k at once (Lloyd's algorithm from k-means++ seeds).

Three things make a sweep over k = 2..16 cheap:

* one greedy k-means++ seeding of max(k) centres serves every k: the seeding is sequential and
  its j-th centre depends only on the earlier ones, so its first k centres are a k-means++
  seeding for k;
* all k iterate together: the centres of every k still moving are stacked, so one matrix
  product per iteration gives every row's distances to all of them, and the cluster sums are
  updated only by the rows that changed cluster;
* the nearest centre is searched in float32 (cluster sums and means stay float64; see
  :func:`kmeans_sweep`).

Stopping follows scikit-learn's Lloyd: a k stops when no label changed or when the summed
squared shift of its centres is at most ``tol`` times the mean per-feature variance; its labels
are then those of the nearest final centre.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def squared_distances(X: Tensor, x_sq: Tensor, C: Tensor) -> Tensor:
    """||x_i - c_j||^2 for rows X [m, D] (squared norms ``x_sq``) and centres C [c, D]."""
    norms = x_sq[:, None] + C.square().sum(1)[None, :]
    return torch.addmm(norms, X, C.T, alpha=-2).clamp_min_(0)


def kmeans_plus_plus(X: Tensor, n_centres: int, generator: torch.Generator) -> Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007): each new centre is the best, by
    potential, of 2 + floor(log n_centres) candidates drawn with probability proportional to the
    squared distance to the nearest centre so far. Returns the row indices of the centres."""
    n = X.shape[0]
    x_sq = X.square().sum(1)
    trials = 2 + int(math.log(n_centres))
    chosen = [int(torch.randint(n, (1,), generator=generator))]
    closest = squared_distances(X, x_sq, X[chosen])[:, 0]
    for _ in range(1, n_centres):
        if closest.sum() > 0:
            weights = closest.to(torch.float64).cpu()
            candidates = torch.multinomial(weights, trials, replacement=True, generator=generator)
        else:  # every row sits on a centre already
            candidates = torch.randint(n, (trials,), generator=generator)
        candidates = candidates.to(X.device)
        with_candidate = torch.minimum(closest[:, None], squared_distances(X, x_sq, X[candidates]))
        best = int(with_candidate.sum(0).argmin())
        chosen.append(int(candidates[best]))
        closest = with_candidate[:, best]
    return torch.tensor(chosen, device=X.device)


class _Sweep:
    """Lloyd iterations of every k together.

    The centres of all k are stacked into one [sum k, D] matrix, k number j owning the rows
    ``offsets[j]`` .. ``offsets[j] + ks[j] - 1``; ``labels`` [N, len(ks)] are local (0 .. k - 1).
    """

    def __init__(self, X: Tensor, X_search: Tensor, scale: float, ks: Tensor, seeds: Tensor):
        self.X = X
        self.X_search = X_search
        self.scale = scale
        self.ks = ks
        self.offsets = torch.cumsum(ks, 0) - ks
        self.slot = torch.arange(int(ks.max()), device=X.device)
        self.owner = torch.repeat_interleave(torch.arange(ks.numel(), device=X.device), ks)
        within = torch.arange(self.owner.numel(), device=X.device) - self.offsets[self.owner]
        self.centres = X[seeds[within]]
        self.sums = torch.zeros_like(self.centres)
        self.counts = torch.zeros(self.centres.shape[0], dtype=X.dtype, device=X.device)
        everything = torch.arange(ks.numel(), device=X.device)
        columns, local_offsets = self._layout(everything)
        self.labels = self._nearest(columns, local_offsets, everything)
        rows = torch.arange(X.shape[0], device=X.device)
        self._add_rows(rows, columns, local_offsets, self.labels, None)

    def _layout(self, active: Tensor) -> tuple[Tensor, Tensor]:
        """Stacked indices of the centres of the ``active`` k, and where each k's block starts
        among them."""
        columns = torch.isin(self.owner, active).nonzero()[:, 0]
        sizes = self.ks[active]
        return columns, torch.cumsum(sizes, 0) - sizes

    def _nearest(self, columns: Tensor, local_offsets: Tensor, active: Tensor) -> Tensor:
        """Label of the nearest centre of every row for each active k: [N, len(active)]."""
        centres = (self.centres[columns] / self.scale).to(self.X_search.dtype)
        # ||x - c||^2 - ||x||^2: the row's own norm does not change which centre is nearest
        scores = torch.addmm(centres.square().sum(1)[None, :], self.X_search, centres.T, alpha=-2)
        # slots past a k's last centre repeat that centre: argmin keeps the first of equal scores
        last = (self.ks[active] - 1)[:, None]
        padded = local_offsets[:, None] + torch.minimum(self.slot[None, :], last)  # [A, width]
        return scores.index_select(1, padded.flatten()).view(-1, *padded.shape).argmin(dim=2)

    def _add_rows(
        self,
        rows: Tensor,
        columns: Tensor,
        local_offsets: Tensor,
        add: Tensor,
        remove: Tensor | None,
    ) -> None:
        """Add each row to the sum and count of its cluster ``add[row, k]`` under each active k,
        and take it out of cluster ``remove[row, k]`` (no change where the two agree)."""
        dtype, device = self.X.dtype, self.X.device
        delta = torch.zeros(rows.numel(), columns.numel(), dtype=dtype, device=device)
        ones = torch.ones(add.shape, dtype=dtype, device=device)
        delta.scatter_add_(1, local_offsets[None, :] + add, ones)
        if remove is not None:
            delta.scatter_add_(1, local_offsets[None, :] + remove, -ones)
        self.sums[columns] += delta.T @ self.X[rows]
        self.counts[columns] += delta.sum(0)

    def step(self, active: Tensor) -> tuple[Tensor, Tensor]:
        """One M-step and E-step for the k in ``active``; returns, per active k, the summed
        squared shift of its centres and whether any label changed."""
        columns, local_offsets = self._layout(active)
        counts = self.counts[columns, None]
        old = self.centres[columns]
        new = torch.where(counts > 0, self.sums[columns] / counts.clamp_min(1), old)
        self.centres[columns] = new
        shift_sq = torch.zeros(self.ks.numel(), dtype=self.X.dtype, device=self.X.device)
        shift_sq.index_add_(0, self.owner[columns], (new - old).square().sum(1))

        before = self.labels[:, active]
        after = self._nearest(columns, local_offsets, active)
        moved = after != before
        rows = moved.any(dim=1).nonzero()[:, 0]
        if rows.numel():
            self._add_rows(rows, columns, local_offsets, after[rows], before[rows])
            self.labels[:, active] = after
        return shift_sq[active], moved.any(dim=0)


def kmeans_sweep(
    X: Tensor,
    ks: Sequence[int],
    seed: int = 0,
    max_iter: int = 300,
    tol: float = 1e-4,
    search_dtype: torch.dtype = torch.float32,
) -> Tensor:
    """k-means labels of the rows of float64 X [N, D] for every k in ``ks``: [N, len(ks)].

    Column j holds labels in [0, ks[j]). Seeded by ``seed`` through a CPU ``torch.Generator``:
    the same draws on every device and in every process.

    Cluster sums, means and shifts are float64; only the k-means++ seeding and the search for
    each row's nearest centre run in ``search_dtype`` (float32 by default: twice as fast, on X
    scaled to max |x| = 1 so nothing overflows). That can only decide differently between two
    centres whose distances agree to about 1e-6, and the labels are all that k-means hands on:
    every reported number is computed in float64 from them.
    """
    if not ks:
        raise ValueError("kmeans_sweep needs at least one k")
    if min(ks) < 2 or max(ks) > X.shape[0]:
        raise ValueError(f"every k must lie in [2, N = {X.shape[0]}], got {list(ks)}")
    n, d = X.shape
    scale = float(X.abs().max()) or 1.0
    X_search = (X / scale).to(search_dtype)
    seeds = kmeans_plus_plus(X_search, max(ks), torch.Generator().manual_seed(seed))
    sweep = _Sweep(X, X_search, scale, torch.tensor(list(ks), device=X.device), seeds)
    mean_variance = (X.square().sum() / n - X.mean(dim=0).square().sum()) / d
    tol_abs = tol * max(float(mean_variance), 0.0)
    active = torch.arange(len(ks), device=X.device)
    for _ in range(max_iter):
        shift_sq, changed = sweep.step(active)
        active = active[changed & (shift_sq > tol_abs)]
        if not active.numel():
            break
    return sweep.labels
