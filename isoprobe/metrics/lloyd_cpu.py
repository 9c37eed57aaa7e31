"""Lloyd's late iterations on the Gram matrix, compiled for the CPU (numba).

After its first iterations Lloyd moves few rows, and an iteration of
:func:`~isoprobe.metrics.kmeans.kmeans_sweep` costs little arithmetic: O(k·N) scores and N
additions per move. In eager PyTorch it still costs some forty operator calls over the
[A, width, N] tables, which is most of a sweep's time on a CPU. :func:`finish_lloyd` runs the
remaining iterations of every block in one compiled loop, with the same updates in the same
order of operations as the PyTorch loop.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def finish_lloyd(
    gram: np.ndarray,
    dots: np.ndarray,
    counts: np.ndarray,
    labels: np.ndarray,
    norms: np.ndarray,
    scores: np.ndarray,
    ks: np.ndarray,
    tol_abs: float,
    max_iter: int,
) -> None:
    """Lloyd from the state of :func:`~isoprobe.metrics.kmeans.kmeans_sweep`'s loop after an
    E-step, until each block stops; ``labels`` [A, N] then holds the final labels.

    Block a has ks[a] real slots. In place: ``dots`` [A, width, N] (T[c, i] = <S_c, x_i>),
    ``counts`` [A, width] (cluster sizes), ``labels``, ``norms`` [A, width] (||centre||²) and
    ``scores`` [A, width, N] (||centre||² - 2 <x_i, centre>). A block stops when no label
    changed or its centres' summed squared shift is at most ``tol_abs``; an empty cluster
    keeps its centre; on a tie the first nearest centre wins.
    """
    n = gram.shape[0]
    for a in range(dots.shape[0]):
        k = ks[a]
        table, size, label = dots[a], counts[a], labels[a]
        norm, score = norms[a], scores[a]
        new_norm = np.empty(k)
        cross = np.empty(k)
        for _ in range(max_iter):
            # M-step: new centre norms, and <new, old> from the old scores
            new_norm[:] = 0.0
            cross[:] = 0.0
            for i in range(n):
                c = label[i]
                new_norm[c] += table[c, i]
                cross[c] += (norm[c] - score[c, i]) / 2
            shift_sq = 0.0
            for c in range(k):
                if size[c] > 0:
                    new_norm[c] /= size[c] * size[c]
                    cross[c] /= size[c]
                    shift_sq += new_norm[c] - 2 * cross[c] + norm[c]
                    norm[c] = new_norm[c]
                    step = -2 / size[c]
                    for i in range(n):
                        score[c, i] = norm[c] + table[c, i] * step
            # E-step: a row that changes cluster moves its Gram row between the tables
            moved = 0
            for i in range(n):
                best = 0
                for c in range(1, k):
                    if score[c, i] < score[best, i]:
                        best = c
                old = label[i]
                if best != old:
                    moved += 1
                    for j in range(n):
                        table[best, j] += gram[i, j]
                        table[old, j] -= gram[i, j]
                    size[best] += 1
                    size[old] -= 1
                    label[i] = best
            if moved == 0 or shift_sq <= tol_abs:
                break
