"""Time ``isoprobe.data.kernelsynth`` against Chronos' own KernelSynth generator, and check that
both draw the same distribution.

The reference does what chronos-forecasting's ``scripts/kernel-synth.py`` does per series: draw
1..5 kernels of the bank with replacement (NumPy's global-style ``RandomState``), fold them with
random + or x, and call ``GaussianProcessRegressor(kernel=k).sample_y(X, 1, random_state=...)``
(one SVD of the 1024 x 1024 covariance per series), timed with the BLAS threads as installed and
with one BLAS thread (what ours uses); the speed-up is against the faster of the two. Ours
generates the whole mixed set at once, without the disk cache.

Distribution checks (printed): per-series standard deviation and lag-1 autocorrelation of
reference and our series, their mean +- sd and a two-sample Kolmogorov-Smirnov p-value; for the
mixed set (the reference series above against ours) and for two fixed single kernels (the
reference is one ``sample_y`` call with many samples there).

Run: ``.venv/bin/python bench/kernelsynth.py`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import functools
import platform
import time

import numpy as np
from scipy.stats import ks_2samp
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import Kernel
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from isoprobe.data import kernelsynth as ks


def reference_series(num_series: int, length: int, seed: int) -> np.ndarray:
    """Chronos-style: one ``sample_y`` per series on its own randomly composed kernel."""
    state = np.random.RandomState(seed)
    bank = ks.kernel_bank(length)
    x = np.linspace(0, 1, length)[:, None]

    def join(a: Kernel, b: Kernel) -> Kernel:
        return a * b if state.rand() < 0.5 else a + b

    out = np.empty((num_series, length))
    for i in tqdm(range(num_series), desc="reference (sample_y per series)", leave=False):
        count = state.randint(1, ks.MAX_KERNELS + 1)
        chosen = [bank[j] for j in state.randint(0, len(bank), size=count)]
        kernel = functools.reduce(join, chosen)
        gp = GaussianProcessRegressor(kernel=kernel)
        out[i] = gp.sample_y(x, 1, random_state=state.randint(2**31)).ravel()
    return out


def statistics_of(series: np.ndarray) -> dict[str, np.ndarray]:
    """Per-series standard deviation and lag-1 autocorrelation (constant series left out)."""
    centred = series - series.mean(axis=1, keepdims=True)
    std = centred.std(axis=1)
    varying = std > 1e-12 * max(float(np.abs(series).max()), 1.0)
    c = centred[varying]
    lag1 = (c[:, 1:] * c[:, :-1]).sum(1) / (c * c).sum(1)
    return {"std": std, "lag-1 autocorrelation": lag1}


def compare(label: str, reference: np.ndarray, ours: np.ndarray) -> None:
    ref, own = statistics_of(reference), statistics_of(ours)
    for stat in ref:
        a, b = ref[stat], own[stat]
        p = ks_2samp(a, b).pvalue
        print(
            f"  {label:<14} {stat:<22} reference {a.mean():9.4f} +- {a.std():8.4f} (n={len(a)})"
            f"   ours {b.mean():9.4f} +- {b.std():8.4f} (n={len(b)})   KS p = {p:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference-series", type=int, default=20)
    parser.add_argument("--series", type=int, default=2000)
    parser.add_argument("--single-series", type=int, default=500)
    parser.add_argument("--length", type=int, default=ks.LENGTH)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, python {platform.python_version()}")

    ref_rates = {}
    for threads in (None, 1):  # BLAS as installed, then one BLAS thread as ours uses
        with threadpool_limits(limits=threads, user_api="blas"):
            start = time.perf_counter()
            reference = reference_series(args.reference_series, args.length, args.seed)
            ref_rates[threads] = args.reference_series / (time.perf_counter() - start)
    ref_rate = max(ref_rates.values())

    start = time.perf_counter()
    ours = ks.generate("mixed", args.series, args.length, args.seed + 1)
    our_rate = args.series / (time.perf_counter() - start)

    print(f"KernelSynth mixed, length {args.length}")
    for threads, rate in ref_rates.items():
        blas = "BLAS threads as installed" if threads is None else "1 BLAS thread"
        print(f"  reference, {blas:<25}: {args.reference_series:6d} series, {rate:8.2f}/s")
    print(f"  isoprobe (grouped product terms)     : {args.series:6d} series, {our_rate:8.2f}/s")
    print(f"  speed-up over the faster reference: {our_rate / ref_rate:.1f}x")

    print("distribution (per-series statistics)")
    compare("mixed", reference, ours)
    x = np.linspace(0, 1, args.length)[:, None]
    for name in ("seasonality_1", "nonlinear_1"):
        kernel = ks.single_kernel(name, args.length)
        gp = GaussianProcessRegressor(kernel=kernel)
        ref = gp.sample_y(x, args.single_series, random_state=args.seed).T
        own = ks.generate(name, args.single_series, args.length, args.seed + 1, progress=False)
        print(f"  {name} = {kernel}")
        compare(name, ref, own)


if __name__ == "__main__":
    main()
