"""k-means for several k at once (Lloyd's algorithm from k-means++ seeds), on the Gram matrix.

Lloyd needs the rows only through their inner products K = X Xᵀ, which the silhouette needs as
well. With S_c the sum of the n_c members of cluster c, its centre is S_c / n_c and

    ||x_i - S_c / n_c||² - ||x_i||² = ||S_c||² / n_c² - 2 T[c, i] / n_c,
    T[c, i] = <S_c, x_i>,   ||S_c||² = sum of T[c, l] over the members l of c,

so the table T decides every assignment. When row l moves from cluster c to c', row c of T
loses K[l] and row c' gains it: N additions per move, where recomputing the distances costs
N·D multiply-adds per centre and iteration. After its first iterations Lloyd moves few rows,
so an iteration costs little more than its O(N·k) bookkeeping.

Four more things make a sweep over k = 2..16 cheap:

* one greedy k-means++ seeding of max(k) centres serves every k: the seeding is sequential and
  its j-th centre depends only on the earlier ones, so its first k centres are a k-means++
  seeding for k;
* all k iterate together: the tables are [A, w, N], block a for the a-th k still iterating and
  w = max(k), slots past a block's k holding centres at infinite distance; the moves of all
  blocks go into one sparse product per iteration;
* a k that has stopped leaves the tables;
* on the CPU, once the moves are few, the remaining iterations of every k run in a compiled
  loop (:mod:`isoprobe.metrics.lloyd_cpu`), free of the per-operator cost of eager PyTorch;
  its blocks are independent, so they run in two halves on two threads.

Everything is float64: the labels are those of plain Lloyd with float64 distances (on an exact
tie, the first nearest centre). Stopping follows scikit-learn's Lloyd: a k stops when no label
changed or when the summed squared shift of its centres is at most ``tol`` times the mean
per-feature variance; its labels are then those of the nearest final centre. A cluster left
empty keeps its centre.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import Tensor

from isoprobe.metrics.gram import gram_matrix
from isoprobe.metrics.lloyd_cpu import finish_lloyd


def kmeans_plus_plus(gram: Tensor, n_centres: int, generator: torch.Generator) -> Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007) of the rows whose Gram matrix is
    ``gram``: each new centre is the best, by potential, of 2 + floor(log n_centres) candidates
    drawn with probability proportional to the squared distance to the nearest centre so far.
    Returns the row indices of the centres."""
    n = gram.shape[0]
    x_sq = gram.diagonal()
    trials = 2 + int(math.log(n_centres))

    def squared_distances(rows: Tensor) -> Tensor:  # [len(rows), N]
        return (x_sq[rows, None] + x_sq[None, :] - 2 * gram[rows]).clamp_min_(0)

    chosen = [int(torch.randint(n, (1,), generator=generator))]
    closest = squared_distances(torch.tensor(chosen, device=gram.device))[0]
    for _ in range(1, n_centres):
        if closest.sum() > 0:
            candidates = torch.multinomial(
                closest.cpu(), trials, replacement=True, generator=generator
            )
        else:  # every row sits on a centre already
            candidates = torch.randint(n, (trials,), generator=generator)
        candidates = candidates.to(gram.device)
        with_candidate = torch.minimum(closest[None, :], squared_distances(candidates))
        best = int(with_candidate.sum(1).argmin())
        chosen.append(int(candidates[best]))
        closest = with_candidate[best]
    return torch.tensor(chosen, device=gram.device)


def _move_rows(
    table: Tensor, rows: Tensor, to: Tensor, away: Tensor | None, X: Tensor, gram: Tensor
) -> None:
    """Row rows[m] of X joins slot to[m] and, unless ``away`` is None, leaves slot away[m]
    (!= to[m]) of ``table`` [slots, N], which holds sums of rows of X Xᵀ: table += M X Xᵀ,
    M the sparse [slots, N] matrix of those moves (+1 at (to[m], rows[m]), -1 at
    (away[m], rows[m])).

    Through the Gram matrix, each move adds one of its rows: N additions, bound by memory.
    Through feature space, (M X) Xᵀ costs N·D multiply-adds at full speed per slot that a row
    joined or left; that is cheaper beyond about D / 8 moves per such slot (the first
    iterations, where most rows move)."""
    slots = to if away is None else torch.cat([to, away])
    rows = rows if away is None else torch.cat([rows, rows])
    values = torch.ones(slots.shape, dtype=table.dtype, device=table.device)
    values[to.numel() :] = -1
    order = torch.argsort(slots * table.shape[1] + rows)
    counts = torch.bincount(slots, minlength=table.shape[0])
    starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    with warnings.catch_warnings():  # torch notes that sparse CSR is "beta" and unchecked
        warnings.filterwarnings("ignore", "Sparse", UserWarning)
        moves = torch.sparse_csr_tensor(
            starts, rows[order], values[order], table.shape, check_invariants=False
        )
    touched = counts.nonzero()[:, 0]
    if 8 * slots.numel() > X.shape[1] * touched.numel():
        table.index_add_(0, touched, (moves @ X)[touched] @ X.T)
    else:
        table.addmm_(moves, gram)


#: Runs half of the blocks of the compiled tail while the caller's thread runs the other half.
_TAIL_HELPER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="isoprobe-lloyd")


def _finish_blocks(
    gram: np.ndarray, state: list[np.ndarray], ks: np.ndarray, tol_abs: float, max_iter: int
) -> None:
    """:func:`~isoprobe.metrics.lloyd_cpu.finish_lloyd` on every block of ``state``. The
    blocks are independent and the kernel releases the GIL, so with two or more torch threads
    the blocks are split in two of about equal total k, one half on a helper thread: the
    compiled loop is single-threaded, and the cores would otherwise wait."""
    cut = max(1, int(np.searchsorted(np.cumsum(ks), ks.sum() / 2)))
    if torch.get_num_threads() < 2 or cut >= len(ks):
        finish_lloyd(gram, *state, ks, tol_abs, max_iter)
        return
    helper = _TAIL_HELPER.submit(
        finish_lloyd, gram, *[part[cut:] for part in state], ks[cut:], tol_abs, max_iter
    )
    finish_lloyd(gram, *[part[:cut] for part in state], ks[:cut], tol_abs, max_iter)
    helper.result()


def kmeans_sweep(
    X: Tensor,
    ks: Sequence[int],
    seed: int = 0,
    max_iter: int = 300,
    tol: float = 1e-4,
    gram: Tensor | None = None,
    compiled_tail: bool = True,
) -> Tensor:
    """k-means labels of the rows of float64 X [N, D] for every k in ``ks``: [N, len(ks)].

    Column j holds labels in [0, ks[j]). Seeded by ``seed`` through a CPU ``torch.Generator``:
    the same draws on every device and in every process. ``gram`` is X Xᵀ if the caller has it
    (see :func:`~isoprobe.metrics.gram.gram_matrix`); it takes N² floats of memory.

    On the CPU, once an iteration moves at most N rows in all, the remaining iterations
    run in :func:`~isoprobe.metrics.lloyd_cpu.finish_lloyd` (``compiled_tail=False``: every
    iteration in PyTorch, as on an accelerator).
    """
    if not ks:
        raise ValueError("kmeans_sweep needs at least one k")
    if min(ks) < 2 or max(ks) > X.shape[0]:
        raise ValueError(f"every k must lie in [2, N = {X.shape[0]}], got {list(ks)}")
    n, d = X.shape
    dtype, device = X.dtype, X.device
    gram = gram_matrix(X) if gram is None else gram
    seeds = kmeans_plus_plus(gram, max(ks), torch.Generator().manual_seed(seed))
    mean_variance = (gram.diagonal().sum() / n - X.mean(dim=0).square().sum()) / d
    tol_abs = tol * max(float(mean_variance), 0.0)

    # The tables hold a block per k still iterating, the sweep's k number which[a] in block a,
    # and a slot per centre of a block, real where j < k: norms [A, width] = ||centre||² (inf
    # on padding), scores [A, width, N] = ||centre||² - 2 <x_i, centre>, whose smallest entry
    # over the slots is row i's nearest centre, and dots [A, width, N] = T = <S_c, x_i>.
    width = max(ks)
    which = torch.arange(len(ks), device=device)
    real = torch.arange(width, device=device)[None, :] < torch.tensor(ks, device=device)[:, None]
    norms = torch.where(real, gram.diagonal()[seeds][None, :], math.inf)
    scores = torch.add(norms[:, :, None], gram[seeds][None], alpha=-2)
    labels = scores.min(dim=1).indices  # [A, N]
    result = torch.empty(len(ks), n, dtype=torch.long, device=device)

    def per_slot(values: Tensor) -> Tensor:  # [A, N] -> [A, width]: sum over each cluster
        return torch.zeros_like(norms).scatter_add_(1, labels, values)

    # viewed as [A * width, N], label j of block a is row a * width + j of a table
    dots = torch.zeros(len(ks), width, n, dtype=dtype, device=device)
    everyone = torch.arange(n, device=device).repeat(len(ks))
    slots = labels + width * torch.arange(len(ks), device=device)[:, None]
    _move_rows(dots.view(-1, n), everyone, slots.flatten(), None, X, gram)
    counts = per_slot(torch.ones(labels.shape, dtype=dtype, device=device))
    changed = real.clone()  # the slots whose members changed since the last M-step
    compiled_tail = compiled_tail and device.type == "cpu"
    for iteration in range(max_iter):
        # M-step: centres S_c / n_c (an empty cluster keeps its centre), and how far they
        # moved: ||new - old||² = ||new||² - 2 <new, old> + ||old||², where <new, old> is the
        # mean over the members of <x_l, old>, read off the old scores; a centre whose
        # members did not change has not moved, and adds exactly 0
        filled = counts > 0
        size = counts.clamp_min(1)
        members = labels[:, None, :]
        new_norms = per_slot(dots.gather(1, members)[:, 0]) / size.square()
        old_products = (norms.gather(1, labels) - scores.gather(1, members)[:, 0]) / 2
        cross = per_slot(old_products) / size
        shift_sq = torch.where(filled & changed, new_norms - 2 * cross + norms, 0.0).sum(1)
        norms = torch.where(filled, new_norms, norms)
        fresh = torch.addcmul(norms[:, :, None], dots, (-2 / size)[:, :, None])
        empty = real & ~filled
        scores = torch.where(empty[:, :, None], scores, fresh) if empty.any() else fresh

        # E-step, and the rows that changed cluster move their Gram rows between the dots
        after = scores.min(dim=1).indices
        moved = after != labels
        block, row = moved.nonzero(as_tuple=True)
        changed = torch.zeros_like(real)
        if block.numel():
            to, away = block * width + after[block, row], block * width + labels[block, row]
            _move_rows(dots.view(-1, n), row, to, away, X, gram)
            ones = torch.ones(to.shape, dtype=dtype, device=device)
            counts.view(-1).index_add_(0, to, ones).index_add_(0, away, ones, alpha=-1)
            changed.view(-1)[torch.cat([to, away])] = True
        labels = after
        going = moved.any(dim=1) & (shift_sq > tol_abs)
        if not going.all():
            result[which[~going]] = labels[~going]
            which, labels, real, changed = which[going], labels[going], real[going], changed[going]
            norms, scores, dots, counts = norms[going], scores[going], dots[going], counts[going]
            if not which.numel():
                break
        if compiled_tail and block.numel() <= n:
            state = [t.contiguous().numpy() for t in (dots, counts, labels, norms, scores, changed)]
            ks_left, left = real.sum(dim=1).numpy(), max_iter - iteration - 1
            _finish_blocks(gram.contiguous().numpy(), state, ks_left, tol_abs, left)
            result[which] = torch.from_numpy(state[2])
            break
    else:
        result[which] = labels
    return result.T
