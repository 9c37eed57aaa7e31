"""Pictures of the probe: 3-D PCA point clouds coloured by cluster (isotropy paper fig. 2) and
metric trajectories over epochs. Matplotlib with the non-interactive Agg backend."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from torch import Tensor  # noqa: E402

from isoprobe.metrics import metric_info  # noqa: E402


def pca_coordinates(X: Tensor, components: int = 3) -> np.ndarray:
    """The rows of X [N, D] on their first ``components`` principal axes (zero-padded when the
    cloud spans fewer dimensions), float64 numpy [N, components]. The axes are the leading
    eigenvectors of the D x D scatter matrix (cheaper than an SVD of the N x D rows)."""
    centred = X.double() - X.double().mean(dim=0)
    _, vectors = torch.linalg.eigh(centred.T @ centred)
    coords = centred @ vectors[:, -components:].flip(1)
    if coords.shape[1] < components:
        coords = torch.nn.functional.pad(coords, (0, components - coords.shape[1]))
    return coords.cpu().numpy()


def cluster_colours(labels: Tensor) -> np.ndarray:
    """RGB 0..255 per row (uint8 [N, 3]) from its cluster label (tab10 palette, cycling)."""
    palette = (np.asarray(plt.get_cmap("tab10").colors) * 255).round().astype(np.uint8)
    return palette[labels.cpu().numpy() % len(palette)]


def save_point_cloud(path: Path, coords: np.ndarray, colours: np.ndarray, title: str) -> None:
    """A 3-D scatter of ``coords`` [N, 3] with RGB ``colours`` [N, 3] (0..255) as a PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=(5, 5))
    ax = fig.add_subplot(projection="3d")
    ax.scatter(*coords.T, c=colours / 255.0, s=4, depthshade=False)
    ax.set_xlabel("PC1")
    ax.set_ylabel("PC2")
    ax.set_zlabel("PC3")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_trajectories(path: Path, records: Iterable[Mapping[str, Any]]) -> bool:
    """One panel per metric, one line per layer (coloured by depth) against the optimizer step
    of each probe (a schedule in steps probes several times per epoch).

    Returns False (and writes nothing) when there is no finite value to draw.
    """
    series: dict[str, dict[str, dict[int, float]]] = {}
    layers: list[str] = []
    for r in records:
        if r["metric"] == "error" or math.isnan(float(r["value"])):
            continue
        step = int(r["global_step"])
        series.setdefault(r["metric"], {}).setdefault(r["layer"], {})[step] = float(r["value"])
        if r["layer"] not in layers:
            layers.append(r["layer"])
    if not series:
        return False
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(layers)))
    cols = min(4, len(series))
    rows = math.ceil(len(series) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.8 * rows), squeeze=False)
    for ax, (metric, by_layer) in zip(axes.flat, series.items(), strict=False):
        for layer, colour in zip(layers, colours, strict=True):
            if layer in by_layer:
                steps = sorted(by_layer[layer])
                values = [by_layer[layer][s] for s in steps]
                ax.plot(steps, values, marker="o", ms=2, lw=1, color=colour, label=layer)
        if metric_info(metric).log_scale:
            ax.set_yscale("log")
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("optimizer step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
    spare = list(axes.flat)[len(series) :]
    for ax in spare:
        ax.axis("off")
    handles = [Line2D([], [], color=colour, marker="o", ms=2, lw=1) for colour in colours]
    if spare:
        spare[0].legend(handles, layers, loc="center", fontsize=7, frameon=False, ncols=2)
        right = 0.98
    else:
        fig.legend(handles, layers, loc="center right", fontsize=7, frameon=False)
        right = 0.86
    fig.subplots_adjust(left=0.06, right=right, bottom=0.08, top=0.94, hspace=0.5, wspace=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def save_flow_of_ranks(
    path: Path, panels: Mapping[str, Mapping[float, Sequence[tuple[str, int]]]], title: str
) -> None:
    """Rank-structure paper figures 5 and 6: one panel per matrix kind (``input``, ``q``, ...),
    the ε-rank against layer (in model order), one line per ε."""
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3), squeeze=False)
    for ax, (panel, by_eps) in zip(axes.flat, panels.items(), strict=True):
        for eps, points in by_eps.items():
            ranks = [rank for _, rank in points]
            ax.plot(range(len(points)), ranks, marker="o", ms=3, label=f"ε={eps:g}")
        names = [layer for layer, _ in next(iter(by_eps.values()))]
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
        ax.set_title(panel, fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    axes.flat[0].set_ylabel("ε-rank", fontsize=8)
    axes.flat[0].legend(fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_spectra(path: Path, spectra: Mapping[str, np.ndarray], title: str) -> None:
    """Rank-structure paper figure 2a: σ_i / σ_1 against i (log scale), one line per matrix,
    coloured by depth."""
    if not spectra:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    colours = plt.get_cmap("viridis")(np.linspace(0, 0.9, len(spectra)))
    for (name, sigma), colour in zip(spectra.items(), colours, strict=True):
        if len(sigma) and sigma[0] > 0:
            ax.semilogy(np.arange(1, len(sigma) + 1), sigma / sigma[0], color=colour, label=name)
    ax.set_xlabel("index i", fontsize=8)
    ax.set_ylabel("σ_i / σ_1", fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, frameon=False, ncols=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_compression_tradeoff(path: Path, rows: Sequence[Mapping[str, float]]) -> None:
    """The compression trade-off against ε (log axis), one point per ε: on the left what is
    kept (attention weights, all parameters, memory), on the right what it costs and gains
    (WQL, MASE and inference time), all relative to the original; the band is WQL within 1%."""
    eps = [r["epsilon"] for r in rows]
    fig, (kept, cost) = plt.subplots(1, 2, figsize=(8, 3.2), sharex=True)
    panels = (
        (
            kept,
            "kept (compressed / original)",
            ("attention_size_ratio", "attention weights"),
            ("parameter_ratio", "parameters"),
            ("memory_ratio", "memory"),
        ),
        (
            cost,
            "compressed / original",
            ("wql_ratio", "WQL"),
            ("mase_ratio", "MASE"),
            ("time_ratio", "inference time"),
        ),
    )
    for ax, ylabel, *series in panels:
        for key, label in series:
            ax.plot(eps, [r[key] for r in rows], marker="o", label=label)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("ε (relative singular-value threshold)", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.legend(fontsize=7, frameon=False)
    cost.axhspan(0.99, 1.01, color="tab:green", alpha=0.1, lw=0)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def save_similarity_heatmap(
    path: Path, layers: Sequence[str], matrix: np.ndarray, title: str
) -> None:
    """Layer against layer (linear CKA, 0..1; NaN: not comparable, left blank) as a heatmap."""
    size = 2.5 + 0.28 * len(layers)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(np.ma.masked_invalid(matrix), vmin=0.0, vmax=1.0, cmap="viridis")
    ax.set_xticks(range(len(layers)), layers, rotation=90, fontsize=6)
    ax.set_yticks(range(len(layers)), layers, fontsize=6)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="linear CKA")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
