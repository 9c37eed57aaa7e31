"""Figure 2's outputs, written into the run directory: ``singular_values.csv`` (σᵢ/σ₁ per model,
long form), ``epsilon_ranks.csv`` (each model's ε-ranks, tokens and width),
``embedding_spectra.png`` (panel a: σᵢ/σ₁ against i, every model on one log plot, each its own
colour, weights drawn at random marked "random init", the legend below the panels; panels b, c:
the embedded inputs of two models projected on their two leading singular vectors, on symmetric
log axes so that the small-spread families are not a blob under white noise) and
``report.html`` (the figure, whether its numbers reproduce the paper's claim
(:mod:`isoprobe.spectra.claim`) and the table on one page)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from isoprobe.analysis.report import write_report  # noqa: E402
from isoprobe.spectra.claim import claim_statement, is_random_init  # noqa: E402
from isoprobe.spectra.spectrum import EmbeddingSpectrum  # noqa: E402

#: line styles by modality: the time-series models solid, the baselines of other modalities not
STYLES = {"time series": "-", "text": "--", "image": ":", "table": "-."}
#: a colour per system: tab10's ten, then four more far from them (figure 2 lists twelve)
COLOURS = (*plt.get_cmap("tab10").colors, "black", "#882255", "#332288", "#ddcc77")
#: panels b, c: the linear part of the symmetric log axes, at most this share of the largest
#: |value| (rounded down to a power of ten)
LINEAR_SHARE = 0.05


def system_label(name: str, modality: str, source: str) -> str:
    """A system's name in the legend: its modality, and "random init" for weights not trained."""
    return f"{name} ({modality}{', random init' if is_random_init(source) else ''})"


def _symlog(panel, points: np.ndarray) -> None:
    """Symmetric log axes on ``points`` [n, 2]: a few far points (white noise) leave the many
    near the origin legible."""
    largest = np.abs(points).max(axis=0)
    largest[largest == 0] = 1.0
    # a power of ten, so that the decade ticks fall at and outside the linear part (a
    # threshold between decades put the tick of the decade below it next to 0's)
    linear = 10.0 ** np.floor(np.log10(LINEAR_SHARE * largest))
    for axis, scale, threshold, top in (
        (panel.xaxis, panel.set_xscale, linear[0], largest[0]),
        (panel.yaxis, panel.set_yscale, linear[1], largest[1]),
    ):
        scale("symlog", linthresh=float(threshold))
        # ticks at 0 and at each decade above the linear part, within the points' range: the
        # threshold's own decade would sit one label's width from 0's
        decades = 10.0 ** np.arange(np.log10(threshold) + 1, np.floor(np.log10(top)) + 1)
        axis.set_ticks(np.concatenate([-decades[::-1], [0.0], decades]))


def rank_table(
    spectra: Mapping[str, EmbeddingSpectrum],
    modalities: Mapping[str, str],
    sources: Mapping[str, str],
    epsilons: Sequence[float],
) -> pd.DataFrame:
    """One row per model: modality, weights, tokens n, width d and the ε-rank at each ε."""
    rows = []
    for name, spectrum in spectra.items():
        row = {
            "model": name,
            "modality": modalities[name],
            "weights": sources[name],
            "random_init": is_random_init(sources[name]),
            "tokens": spectrum.shape[0],
            "width": spectrum.shape[1],
        }
        row.update({f"rank_eps{eps:g}": spectrum.epsilon_rank(eps) for eps in epsilons})
        rows.append(row)
    return pd.DataFrame(rows)


def singular_value_table(spectra: Mapping[str, EmbeddingSpectrum]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"model": name, "i": i + 1, "relative_singular_value": float(value)}
            for name, spectrum in spectra.items()
            for i, value in enumerate(spectrum.relative)
        ]
    )


def draw_figure(
    spectra: Mapping[str, EmbeddingSpectrum],
    modalities: Mapping[str, str],
    sources: Mapping[str, str],
    projected: Sequence[str],
    labels: Mapping[str, Sequence[str]],
    path: Path,
) -> Path:
    """Panel (a) and one projection panel per name in ``projected``, its points coloured by
    the signal family they came from where ``labels`` has the rows' families."""
    shown = [name for name in projected if name in spectra]
    fig = plt.figure(figsize=(6.0 + 3.2 * len(shown), 5.2), layout="constrained")
    grid = fig.add_gridspec(1, 1 + len(shown), width_ratios=[1.9] + [1.0] * len(shown))
    ax = fig.add_subplot(grid[0])
    for k, (name, spectrum) in enumerate(spectra.items()):
        index = range(1, len(spectrum.relative) + 1)
        ax.loglog(
            index,
            spectrum.relative.clamp_min(1e-16).numpy(),
            STYLES.get(modalities[name], "-"),
            color=COLOURS[k % len(COLOURS)],
            label=system_label(name, modalities[name], sources[name]),
            linewidth=1.6,
        )
    ax.set(
        xlabel="i (log scale)",
        ylabel="σᵢ / σ₁",
        title="(a) singular values of the embedded inputs",
    )
    ax.set_ylim(bottom=1e-8, top=1.5)
    ax.grid(True, which="major", alpha=0.3)
    fig.legend(
        *ax.get_legend_handles_labels(),
        loc="outside lower center",
        ncols=max(1, int(fig.get_figwidth() // 2.6)),
        fontsize=7,
        title="(a) system (modality)",
        title_fontsize=8,
    )
    for k, name in enumerate(shown):
        panel = fig.add_subplot(grid[k + 1])
        points = spectra[name].projection.numpy()
        groups = labels.get(name)
        if groups is None:
            panel.scatter(points[:, 0], points[:, 1], s=3, alpha=0.35, linewidths=0)
        else:
            for family in dict.fromkeys(groups):
                chosen = [i for i, g in enumerate(groups) if g == family]
                panel.scatter(
                    points[chosen, 0],
                    points[chosen, 1],
                    s=3,
                    alpha=0.45,
                    linewidths=0,
                    label=family.replace("_", " "),
                )
            panel.legend(fontsize=7, markerscale=3, frameon=False)
        _symlog(panel, points)
        panel.set(
            xlabel="1st singular vector (symmetric log)",
            ylabel="2nd singular vector (symmetric log)",
            title=f"({chr(ord('b') + k)}) {name}'s embedded inputs",
        )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(
    output: Path,
    spectra: Mapping[str, EmbeddingSpectrum],
    modalities: Mapping[str, str],
    sources: Mapping[str, str],
    epsilons: Sequence[float],
    projected: Sequence[str],
    labels: Mapping[str, Sequence[str]],
    notes: Sequence[str],
) -> dict[str, Path]:
    ranks = rank_table(spectra, modalities, sources, epsilons)
    paths = {
        "epsilon_ranks": output / "epsilon_ranks.csv",
        "singular_values": output / "singular_values.csv",
        "figure": output / "embedding_spectra.png",
        "report": output / "report.html",
    }
    ranks.to_csv(paths["epsilon_ranks"], index=False)
    singular_value_table(spectra).to_csv(paths["singular_values"], index=False)
    draw_figure(spectra, modalities, sources, projected, labels, paths["figure"])
    caption = (
        "(a) σᵢ/σ₁ of each model's embedded inputs (time-series models solid, text dashed, "
        "images dotted; random init: weights drawn at random, not the trained model); (b, c) "
        "embedded inputs projected on their two leading singular vectors (symmetric log axes), "
        "coloured by the signal family they came from where they read the signals"
    )
    random = [name for name, source in sources.items() if is_random_init(source)]
    found = [claim_statement(ranks)]
    if random:
        found.append(
            f"Random init, not trained (offline, built as their official code initialises "
            f"them): {', '.join(random)}."
        )
    write_report(
        paths["report"],
        "Embedding spectra (rank-structure paper, figure 2)",
        [*notes, *(text for text in found if text)],
        [(paths["figure"], caption)],
        [("ε-rank of the embedded inputs", ranks)],
    )
    return paths
