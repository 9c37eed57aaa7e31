"""kmeans_sweep: recovers separated clusters, ends at a Lloyd fixed point, gives exactly the
labels of plain Lloyd (with its late iterations compiled, and all in PyTorch), handles ties."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

import isoprobe.metrics.kmeans as kmeans_module
from isoprobe.metrics import kmeans_sweep
from isoprobe.metrics.gram import gram_matrix
from isoprobe.metrics.kmeans import _move_rows, kmeans_plus_plus
from isoprobe.metrics.lloyd_cpu import finish_lloyd


def test_true_k_recovers_the_clusters_as_sklearn_does(separated_clusters):
    X, truth = separated_clusters()
    ks = list(range(2, 9))
    labels = kmeans_sweep(X, ks, seed=0)
    assert labels.shape == (X.shape[0], len(ks))
    for j, k in enumerate(ks):
        assert int(labels[:, j].min()) >= 0 and int(labels[:, j].max()) < k
    ours = labels[:, ks.index(4)].numpy()
    reference = KMeans(n_clusters=4, random_state=42).fit_predict(X.numpy())
    assert adjusted_rand_score(ours, truth) == 1.0
    assert adjusted_rand_score(ours, reference) == 1.0


def test_without_tolerance_every_k_ends_at_a_lloyd_fixed_point(gaussian):
    # No cluster structure, so Lloyd needs many iterations: each row must end nearest to the
    # mean of its own cluster, for every k of the sweep.
    X = gaussian(400, 8, seed=7)
    ks = [2, 3, 5, 8, 13]
    labels = kmeans_sweep(X, ks, seed=3, tol=0.0).numpy()
    points = X.numpy()
    for j, k in enumerate(ks):
        centres = np.stack([points[labels[:, j] == c].mean(0) for c in range(k)])
        dist = ((points[:, None, :] - centres[None]) ** 2).sum(-1)
        own = dist[np.arange(len(points)), labels[:, j]]
        assert np.all(own <= dist.min(1) * (1 + 1e-12))


def plain_lloyd(
    X: np.ndarray, centres: np.ndarray, tol: float, labels: np.ndarray | None = None
) -> np.ndarray:
    """Textbook Lloyd in float64 from ``centres`` (and their ``labels``, if given), stopping
    as kmeans_sweep documents (no label changed, or squared centre shift <= tol * mean feature
    variance) or after 300 iterations; an empty cluster keeps its centre."""
    tol_abs = tol * X.var(axis=0).mean()
    k = len(centres)
    if labels is None:
        labels = ((X[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
    for _ in range(300):
        new = np.stack(
            [X[labels == c].mean(0) if (labels == c).any() else centres[c] for c in range(k)]
        )
        shift_sq = ((new - centres) ** 2).sum()
        centres = new
        after = ((X[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
        changed = (after != labels).any()
        labels = after
        if not changed or shift_sq <= tol_abs:
            break
    return labels


@pytest.fixture
def compiled_calls(monkeypatch):
    """How many times kmeans_sweep handed its late iterations to the compiled kernel."""
    calls = []

    def spy(*args):
        calls.append(args[0].shape[0])
        return finish(*args)

    finish = kmeans_module.finish_lloyd
    monkeypatch.setattr(kmeans_module, "finish_lloyd", spy)
    return calls


@pytest.mark.parametrize("compiled_tail", [True, False])
@pytest.mark.parametrize("tol", [1e-4, 0.0])
@pytest.mark.parametrize("cloud", ["gaussian", "anisotropic", "wide", "clusters"])
def test_labels_are_those_of_plain_lloyd_from_the_same_seeds(
    gaussian, separated_clusters, compiled_calls, cloud, tol, compiled_tail
):
    # The sweep runs on the Gram matrix, all k together, with incremental cluster sums; the
    # labels must still be exactly those of Lloyd done the plain way, k by k, whether the
    # late iterations run in the compiled kernel or in PyTorch. ("wide" has enough features
    # that the cluster sums are updated both through the Gram matrix and, at first, through
    # feature space.)
    if cloud == "gaussian":
        X = gaussian(500, 12, seed=1)
    elif cloud == "anisotropic":
        X = gaussian(600, 30, seed=2, scales=torch.arange(1, 31, dtype=torch.float64) ** -1.0)
    elif cloud == "wide":
        X = gaussian(300, 128, seed=3, scales=torch.arange(1, 129, dtype=torch.float64) ** -0.5)
    else:
        X, _ = separated_clusters(sizes=(150, 100, 60, 30), d=16, seed=4)
    ks = list(range(2, 17))
    seed = 6
    labels = kmeans_sweep(X, ks, seed=seed, tol=tol, compiled_tail=compiled_tail).numpy()
    assert bool(compiled_calls) == compiled_tail
    seeds = kmeans_plus_plus(gram_matrix(X), max(ks), torch.Generator().manual_seed(seed))
    for j, k in enumerate(ks):
        expected = plain_lloyd(X.numpy(), X.numpy()[seeds[:k]], tol)
        assert np.array_equal(labels[:, j], expected), f"k = {k}"


def test_compiled_tail_splits_its_blocks_over_two_threads(gaussian, monkeypatch):
    """With two torch threads the tail's blocks run in two halves on two threads; the labels
    are those of one thread running them all."""
    X = gaussian(500, 12, seed=1)
    ks = list(range(2, 17))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kmeans_sweep(X, ks, seed=6)
        callers = []
        finish = kmeans_module.finish_lloyd

        def spy(*args):
            callers.append((threading.current_thread().name, args[1].shape[0]))
            return finish(*args)

        monkeypatch.setattr(kmeans_module, "finish_lloyd", spy)
        torch.set_num_threads(2)
        split = kmeans_sweep(X, ks, seed=6)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, alone)
    assert len({name for name, _ in callers}) == 2 and all(blocks for _, blocks in callers)


def run_kernel(points: np.ndarray, centres: np.ndarray) -> list[np.ndarray]:
    """finish_lloyd on one block, from the state after an E-step against ``centres`` (labels
    = nearest centre, the first on a tie); returns its state: tables, sizes, labels, centre
    norms, scores."""
    labels = ((points[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1)
    onehot = np.eye(len(centres))[labels].T
    gram = points @ points.T
    norms = (centres**2).sum(1)
    scores = norms[:, None] - 2 * centres @ points.T
    state = [a[None].copy() for a in (onehot @ gram, onehot.sum(1), labels, norms, scores)]
    everything_changed = np.ones((1, len(centres)), dtype=bool)
    finish_lloyd(gram, *state, everything_changed, np.array([len(centres)]), 0.0, 300)
    return [a[0] for a in state]


def test_compiled_kernel_keeps_an_empty_clusters_centre(gaussian):
    # centre 2 is so far away that it never has members: plain Lloyd from the same centres
    # keeps it, and so must the kernel
    points = gaussian(300, 5, seed=8).numpy()
    centres = np.concatenate([points[[0, 1]], np.full((1, 5), 1e3), points[[2]]])
    _, sizes, labels, norms, _ = run_kernel(points, centres)
    assert np.array_equal(labels, plain_lloyd(points, centres, tol=0.0))
    assert sizes[2] == 0 and norms[2] == (centres[2] ** 2).sum()


def test_compiled_kernel_gives_a_tie_to_the_first_centre():
    # centres -1.5 and 1.5 are the means of {-3, 0} and {1.5}: the row at 0 is exactly as far
    # from both, stays with the first, and nothing moves
    points = np.array([[-3.0], [0.0], [1.5]])
    _, _, labels, _, _ = run_kernel(points, np.array([[-1.5], [1.5]]))
    assert labels.tolist() == [0, 0, 1]


def test_compiled_kernel_keeps_a_tie_with_an_unmoved_centre():
    # Integers, so every distance is exact. From centres -9, 9, -8 the clusters are
    # {} (keeps -9), {4, 12} (8) and {0, -6} (-3); then -6 joins cluster 0, whose centre
    # becomes -6, cluster 2's becomes 0 and cluster 1's stays at 8. The kernel compares the
    # row at 4, whose own centre did not move, only with the recomputed ones: it is 4 from
    # both 8 (cluster 1, its own) and 0 (cluster 2). Plain Lloyd gives the tie to the first
    # centre, so the row stays in cluster 1.
    points = np.array([[0.0], [-6.0], [4.0], [12.0]])
    centres = np.array([[-9.0], [9.0], [-8.0]])
    _, _, labels, _, _ = run_kernel(points, centres)
    assert np.array_equal(labels, plain_lloyd(points, centres, tol=0.0))


@pytest.mark.parametrize("n_moves", [3, 400])
def test_moves_reach_the_cluster_sums_either_way(gaussian, n_moves):
    # few moves go through the Gram matrix, many through feature space: the same sums
    X = gaussian(200, 40, seed=5)
    g = torch.Generator().manual_seed(n_moves)
    rows = torch.randint(200, (n_moves,), generator=g)
    to = torch.randint(10, (n_moves,), generator=g)
    away = (to + torch.randint(1, 10, (n_moves,), generator=g)) % 10
    expected = torch.ones(10, 200, dtype=X.dtype)
    expected.index_add_(0, to, X[rows] @ X.T).index_add_(0, away, X[rows] @ X.T, alpha=-1)
    table = torch.ones(10, 200, dtype=X.dtype)
    _move_rows(table, rows, to, away, X, gram_matrix(X))
    assert torch.allclose(table, expected, rtol=1e-12, atol=1e-11)


def test_gram_matrix_is_exactly_symmetric_whatever_the_block_size(gaussian):
    X = gaussian(301, 7, seed=9)
    for block_rows in (37, 128, 1000):
        gram = gram_matrix(X, block_rows)
        assert torch.equal(gram, gram.T)
        assert torch.allclose(gram, X @ X.T, rtol=1e-13, atol=1e-12)


def test_seed_fixes_the_result_and_duplicate_rows_share_a_label():
    base = torch.tensor([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]], dtype=torch.float64)
    X = base.repeat_interleave(4, dim=0)  # 12 rows, 3 distinct points, k up to 6
    labels = kmeans_sweep(X, [2, 3, 6], seed=11)
    assert torch.equal(labels, kmeans_sweep(X, [2, 3, 6], seed=11))
    for j in range(3):
        column = labels[:, j].view(3, 4)
        assert torch.all(column == column[:, :1])
    assert len(set(labels[:, 1].tolist())) == 3


def test_impossible_k_is_refused(gaussian):
    with pytest.raises(ValueError, match="k must lie in"):
        kmeans_sweep(gaussian(5, 2), [2, 6])
    with pytest.raises(ValueError, match="k must lie in"):
        kmeans_sweep(gaussian(5, 2), [1, 2])
