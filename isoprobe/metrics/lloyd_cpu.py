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
    changes: np.ndarray,
    ks: np.ndarray,
    tol_abs: float,
    max_iter: int,
) -> None:
    """Lloyd from the state of :func:`~isoprobe.metrics.kmeans.kmeans_sweep`'s loop after an
    E-step, until each block stops; ``labels`` [A, N] then holds the final labels.

    Block a has ks[a] real slots. In place: ``dots`` [A, width, N] (T[c, i] = <S_c, x_i>),
    ``counts`` [A, width] (cluster sizes), ``labels``, ``norms`` [A, width] (||centre||²) and
    ``scores`` [A, width, N] (||centre||² - 2 <x_i, centre>); read only: ``changes``
    [A, width], the clusters that gained or lost members in that E-step. A block stops when no label
    changed or its centres' summed squared shift is at most ``tol_abs`` (a centre whose
    members did not change has not moved: it adds exactly 0); an empty cluster keeps its
    centre; on a tie the first nearest centre wins.
    """
    n = gram.shape[0]
    for a in range(dots.shape[0]):
        k = ks[a]
        table, size, label = dots[a], counts[a], labels[a]
        norm, score = norms[a], scores[a]
        new_norm = np.empty(k)
        cross = np.empty(k)
        changed = changes[a, :k].copy()  # members joined or left since the last M-step
        fresh = np.empty(k, dtype=np.bool_)  # centre recomputed in this M-step
        fresh_list = np.empty(k, dtype=np.int64)
        for _ in range(max_iter):
            # M-step, for the clusters whose members changed (the others' centres, and so
            # their scores, stay as they are, bit for bit): new centre norms, and
            # <new, old> from the old scores
            new_norm[:] = 0.0
            cross[:] = 0.0
            for i in range(n):
                c = label[i]
                if changed[c]:
                    new_norm[c] += table[c, i]
                    cross[c] += (norm[c] - score[c, i]) / 2
            shift_sq = 0.0
            n_fresh = 0
            for c in range(k):
                fresh[c] = changed[c] and size[c] > 0
                if fresh[c]:
                    new_norm[c] /= size[c] * size[c]
                    cross[c] /= size[c]
                    shift_sq += new_norm[c] - 2 * cross[c] + norm[c]
                    norm[c] = new_norm[c]
                    step = -2 / size[c]
                    for i in range(n):
                        score[c, i] = norm[c] + table[c, i] * step
                    fresh_list[n_fresh] = c
                    n_fresh += 1
            # E-step: a row whose own centre stayed keeps it unless a recomputed centre is
            # nearer (or as near with a lower index); a row that changes cluster moves its
            # Gram row between the tables
            changed[:] = False
            moved = 0
            for i in range(n):
                old = label[i]
                best = old
                if fresh[old]:
                    best = 0
                    for c in range(1, k):
                        if score[c, i] < score[best, i]:
                            best = c
                else:
                    for m in range(n_fresh):
                        c = fresh_list[m]
                        if score[c, i] < score[best, i] or (
                            score[c, i] == score[best, i] and c < best
                        ):
                            best = c
                if best != old:
                    moved += 1
                    for j in range(n):
                        table[best, j] += gram[i, j]
                        table[old, j] -= gram[i, j]
                    size[best] += 1
                    size[old] -= 1
                    label[i] = best
                    changed[best] = True
                    changed[old] = True
            if moved == 0 or shift_sq <= tol_abs:
                break
