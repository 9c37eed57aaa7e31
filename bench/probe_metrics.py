"""Time ``isoprobe.metrics.probe_metrics`` against the isotropy authors' reference computation.

The reference is what the authors' public code does for the cluster-adjusted cosine: on the
globally centred tokens, scikit-learn ``KMeans(n_clusters=k, random_state=42)`` and
``silhouette_score`` for every k in 2..16, the k of the best silhouette (one cluster if it is
below 0.1, as the authors' code does), then the mean inter-token cosine inside the
centroid-subtracted clusters. Ours is the FULL metric suite (both cosines, cluster cosine,
effective dimension, participation ratio, partition ratio, IsoScore, epsilon-rank) in float64.

Token clouds (N x 512, seeded): ``structured`` = a few anisotropic Gaussian clusters of different
sizes and scales plus a common offset (what transformer layers look like: islands, a few
dominant directions); ``unstructured`` = one anisotropic Gaussian with the offset and a steep
spectrum (no clusters); ``diffuse`` = one Gaussian with a slowly decaying spectrum, where no
silhouette reaches 0.1 (both should pick one cluster) and k-means needs many iterations.

Every timed call starts after a short pause (``SETTLE_S``), so that no call pays for the
idle spinning of the threads of the library that ran before it.

The probes' share of a fine-tuning epoch is ``bench/probe_share.py``'s.

Run: ``.venv/bin/python bench/probe_metrics.py`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from isoprobe.metrics import ProbeMetricsConfig, probe_metrics, reference
from isoprobe.metrics._tokens import centre
from isoprobe.metrics.gram import feature_gram, gram_matrix, pairwise_distances_
from isoprobe.metrics.kmeans import kmeans_sweep
from isoprobe.metrics.silhouette import silhouette_scores
from isoprobe.metrics.spectrum import covariance_eigenvalues_from_uncentred

K_RANGE = range(2, 17)
MIN_SILHOUETTE = 0.1
#: Pause before every timed call. After each call, OpenBLAS's worker threads (numpy's and
#: scikit-learn's) keep spinning for about 0.1 s (OpenBLAS's THREAD_TIMEOUT, 2^28 cycles) and
#: take a core from whatever runs next; without the pause, a call timed right after the
#: reference runs up to a third slower (``OPENBLAS_THREAD_TIMEOUT=4`` removes that too).
SETTLE_S = 0.25


def anisotropic_gaussian(
    rng: np.random.Generator, n: int, dim: int, scale: float, decay: float
) -> np.ndarray:
    """n samples with variances scale^2 * i^-decay along randomly rotated axes."""
    stds = scale * np.arange(1, dim + 1) ** (-decay / 2)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return (rng.normal(size=(n, dim)) * stds) @ rotation.T


def structured_cloud(n: int, dim: int, seed: int) -> np.ndarray:
    """Five anisotropic clusters of unequal sizes and scales around a common offset."""
    rng = np.random.default_rng(seed)
    weights = np.array([0.35, 0.25, 0.2, 0.12, 0.08])
    sizes = np.floor(weights * n).astype(int)
    sizes[0] += n - sizes.sum()
    offset = rng.normal(size=dim) * 3.0
    parts = []
    for size, scale in zip(sizes, (1.0, 1.5, 0.7, 2.0, 1.2), strict=True):
        centre = rng.normal(size=dim) * 1.2
        parts.append(centre + anisotropic_gaussian(rng, size, dim, scale, decay=1.0))
    X = np.concatenate(parts) + offset
    return X[rng.permutation(n)]


def unstructured_cloud(n: int, dim: int, seed: int) -> np.ndarray:
    """One anisotropic Gaussian around the common offset, variances ~ i^-2: no clusters, and
    an effective dimension of 3, like the layers of isotropy paper Table 1."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=dim) * 3.0 + anisotropic_gaussian(rng, n, dim, 1.0, decay=2.0)


def diffuse_cloud(n: int, dim: int, seed: int) -> np.ndarray:
    """One Gaussian with variances ~ 1/i (effective dimension ~ 115): the hard case for
    k-means, whose silhouettes stay below 0.1 (one cluster) while Lloyd iterates long."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=dim) * 3.0 + anisotropic_gaussian(rng, n, dim, 1.0, decay=1.0)


def reference_cluster_cosine(X: np.ndarray) -> tuple[float, int, float]:
    """The authors' computation, as :mod:`isoprobe.metrics.reference` defines it (scikit-learn
    k-means and silhouettes, seed 42): (cluster cosine, k, best silhouette)."""
    return reference.cluster_adjusted_cosine(
        X, K_RANGE.start, K_RANGE.stop - 1, MIN_SILHOUETTE, seed=42
    )


def timed(fn, *args):
    """(seconds, result) of one call, started after a pause of ``SETTLE_S``."""
    time.sleep(SETTLE_S)
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def measure(X: np.ndarray, repeats: int, ref_repeats: int) -> dict:
    """Best-of-``repeats`` times of our full suite and of our cluster cosine alone, and
    best-of-``ref_repeats`` of the reference, the calls interleaved so that all see the same
    machine load; the k, silhouette and cosine of each."""
    tokens = torch.as_tensor(X)
    cluster_only = ProbeMetricsConfig(metrics=("cos_cluster",))
    ours, ours_cluster, ref = [], [], []
    for r in range(max(repeats, ref_repeats)):
        if r < repeats:
            seconds, out = timed(probe_metrics, tokens)
            ours.append(seconds)
            seconds, _ = timed(probe_metrics, tokens, cluster_only)
            ours_cluster.append(seconds)
        if r < ref_repeats:
            seconds, (ref_cos, ref_k, ref_sil) = timed(reference_cluster_cosine, X)
            ref.append(seconds)
    row = {"ours_s": min(ours), "cluster_s": min(ours_cluster), "k": int(out["n_clusters"])}
    row.update(sil=out["silhouette"], cos=out["cos_cluster"])
    if ref:
        row.update(ref_s=min(ref), ref_k=ref_k, ref_sil=ref_sil, ref_cos=ref_cos)
    return row


def stage_times(X: np.ndarray, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` milliseconds of each stage of the suite, run one after the other:
    the fixed linear algebra (Gram matrix, its conversion to distances, covariance product,
    the eigendecomposition of Xᵀ X and the downdate that gives the covariance spectrum from it,
    the partition function's projections, the silhouettes) and the data-dependent k-means.
    The in-place distance stage overwrites a scratch copy; the copy's own time is subtracted."""
    tokens = torch.as_tensor(X)
    centred = centre(tokens)
    gram = gram_matrix(centred)
    distances = pairwise_distances_(gram.clone())
    uncentred = feature_gram(tokens)
    values, vectors = torch.linalg.eigh(uncentred)
    mean = tokens.mean(dim=0)
    ks = list(K_RANGE)
    labels = kmeans_sweep(centred, ks, gram=gram)
    scratch = gram.clone()
    stages = {
        "gram": lambda: gram_matrix(centred),
        "distances": lambda: pairwise_distances_(scratch.copy_(gram)),
        "cov": lambda: feature_gram(centred),
        "eigh": lambda: torch.linalg.eigh(uncentred),
        "downdate": lambda: covariance_eigenvalues_from_uncentred(values, vectors, mean, len(X)),
        "proj": lambda: vectors.T @ tokens.T,
        "silhouette": lambda: silhouette_scores(centred, labels, distances=distances),
        "kmeans": lambda: kmeans_sweep(centred, ks, gram=gram),
    }
    times = {
        name: 1e3 * min(timed(stage)[0] for _ in range(repeats)) for name, stage in stages.items()
    }
    copy_ms = 1e3 * min(timed(scratch.copy_, gram)[0] for _ in range(repeats))
    times["distances"] = max(times["distances"] - copy_ms, 0.0)
    return times


def print_breakdown(rows: list[dict]) -> None:
    """Per cloud, each stage's time, the fixed stages' sum and the budget a 10x target leaves."""
    names = list(rows[0]["stages"])
    header = f"{'cloud':<13}{'N':>6}" + "".join(f"{n:>11}" for n in names)
    header += f"{'fixed':>8}{'all':>7}{'ref/10':>8}"
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        stages = r["stages"]
        fixed = sum(v for n, v in stages.items() if n != "kmeans")
        line = f"{r['cloud']:<13}{r['N']:>6}" + "".join(f"{stages[n]:>11.1f}" for n in names)
        line += f"{fixed:>8.0f}{fixed + stages['kmeans']:>7.0f}"
        line += f"{1e2 * r['ref_s']:>8.0f}" if "ref_s" in r else f"{'-':>8}"
        print(line)
    print(
        "milliseconds, each stage alone and best of the repeats; fixed = all but k-means, which "
        "is what the suite computes whatever the data; ref/10 = the time a 10x target allows"
    )


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'cloud':<13}{'N':>6}{'suite s':>9}{'cos s':>8}{'ref s':>8}{'suite x':>9}{'cos x':>7}"
        f"{'k':>4}{'k ref':>6}{'k agree':>8}{'sil':>7}{'sil ref':>8}{'|d cos|':>9}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in rows:
        ours = f"{r['cloud']:<13}{r['N']:>6}{r['ours_s']:>9.3f}{r['cluster_s']:>8.3f}"
        if "ref_s" in r:
            ref = (
                f"{r['ref_s']:>8.2f}{r['ref_s'] / r['ours_s']:>8.1f}x"
                f"{r['ref_s'] / r['cluster_s']:>6.1f}x{r['k']:>4}{r['ref_k']:>6}"
                f"{str(r['k'] == r['ref_k']):>8}{r['sil']:>7.3f}{r['ref_sil']:>8.3f}"
                f"{abs(r['cos'] - r['ref_cos']):>9.1e}"
            )
        else:
            dash = "-"
            ref = f"{dash:>8}{dash:>9}{dash:>7}{r['k']:>4}{dash:>6}{dash:>8}{r['sil']:>7.3f}"
            ref += f"{dash:>8}{dash:>9}"
        print(ours + ref)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of ours (best)")
    parser.add_argument(
        "--ref-repeats", type=int, default=2, help="timed calls of the reference (best)"
    )
    parser.add_argument(
        "--reference-max-n",
        type=int,
        default=8000,
        help="run the sklearn reference only up to this N (about 30 s at N = 8000)",
    )
    parser.add_argument("--threads", type=int, default=None, help="limit torch and sklearn")
    parser.add_argument(
        "--breakdown", action="store_true", help="also time each stage of the suite alone"
    )
    args = parser.parse_args()

    if args.threads is not None:
        torch.set_num_threads(args.threads)
        threadpool_limits(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.2f}"
    )
    probe_metrics(torch.as_tensor(structured_cloud(300, 16, args.seed)))  # warm-up
    clouds = {
        "structured": structured_cloud,
        "unstructured": unstructured_cloud,
        "diffuse": diffuse_cloud,
    }
    jobs = [(name, n) for n in args.sizes for name in clouds]
    rows = []
    for name, n in tqdm(jobs, desc="bench"):
        ref_repeats = args.ref_repeats if n <= 2000 else min(args.ref_repeats, 1)
        if n > args.reference_max_n:
            ref_repeats = 0
        repeats = args.repeats if n <= 2000 else min(args.repeats, 2)
        X = clouds[name](n, args.dim, args.seed)
        row = measure(X, repeats, ref_repeats)
        if args.breakdown:
            row["stages"] = stage_times(X, repeats)
        rows.append({"cloud": name, "N": n, **row})
    print_table(rows)
    print(
        f"\nsuite = our full probe_metrics (all metrics), cos = ours with only cos_cluster, both "
        f"best of {args.repeats} (2 above N = 2000); ref = sklearn KMeans(random_state=42) + "
        f"silhouette_score for k = 2..16 + cluster cosine, best of {args.ref_repeats} (1 above "
        f"N = 2000); x = ref time / ours. Load average now {os.getloadavg()[0]:.2f}"
    )
    if args.breakdown:
        print_breakdown(rows)


if __name__ == "__main__":
    main()
