"""The analysis figures, as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from isoprobe.analysis.correlations import BLOCK, PAIRED_PROBE, geometry_at  # noqa: E402
from isoprobe.analysis.study import Study  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def papers_form(study: Study, forecast: str, metric: str, path: Path) -> Path | None:
    """Per model, the forecast error beside the last layer's ``metric`` for every data set
    (the isotropy paper's figures 3 and 7)."""
    geometry = geometry_at(study, PAIRED_PROBE[forecast.split("_", 1)[0]])
    key = ("isotropy", metric, "last")
    if key not in geometry.columns:
        return None
    runs = study.runs.set_index("run")
    frame = runs[["model", "dataset", forecast]].join(geometry[key].rename(metric))
    models = sorted(frame["model"].dropna().unique())
    fig, axes = plt.subplots(len(models), 1, figsize=(9, 2.8 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models, strict=True):
        part = frame[frame["model"] == model].groupby("dataset")[[forecast, metric]].mean()
        positions = np.arange(len(part))
        ax.bar(positions - 0.2, part[forecast], 0.4, color="tab:red", label=forecast)
        ax.set_ylabel(forecast, color="tab:red")
        twin = ax.twinx()
        twin.bar(positions + 0.2, part[metric], 0.4, color="tab:blue", label=f"{metric} (last)")
        twin.set_ylabel(f"{metric} (last layer)", color="tab:blue")
        ax.set_xticks(positions, part.index, rotation=30, ha="right", fontsize=8)
        ax.set_title(model)
    return _save(fig, path)


def scatter(
    study: Study, table: pd.DataFrame, forecast: str, metrics: list[str], path: Path
) -> Path | None:
    """``forecast`` against each metric of the last layer, coloured by model, with ρ and its
    95% interval (group ``all``) in each title."""
    geometry = geometry_at(study, PAIRED_PROBE[forecast.split("_", 1)[0]])
    keys = [k for k in geometry.columns if k[2] == "last" and k[1] in metrics]
    if not keys:
        return None
    runs = study.runs.set_index("run")
    columns = 4
    rows = int(np.ceil(len(keys) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.2 * rows), squeeze=False)
    models = sorted(runs["model"].dropna().unique())
    colours = dict(zip(models, plt.cm.tab10.colors, strict=False))
    for ax, key in zip(axes.flat, keys, strict=False):
        for model in models:
            members = [r for r in runs.index[runs["model"] == model] if r in geometry.index]
            ax.scatter(
                geometry.loc[members, key],
                runs.loc[members, forecast],
                s=14,
                color=colours[model],
                label=model,
            )
        found = table[
            (table["metric"] == key[1])
            & (table["layer"] == "last")
            & (table["forecast_metric"] == forecast)
            & (table["group"] == "all")
            & (table["probe"] == key[0])
        ]
        title = key[1]
        if len(found) and np.isfinite(found["spearman"].iloc[0]):
            r = found.iloc[0]
            title += f"\nρ={r.spearman:.2f} [{r.spearman_lo:.2f}, {r.spearman_hi:.2f}] n={r.n}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"{key[1]} (last layer)", fontsize=8)
        ax.set_ylabel(forecast, fontsize=8)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    return _save(fig, path)


def heatmap(table: pd.DataFrame, forecast: str, path: Path) -> Path | None:
    """ρ (group ``all``) over metric × layer choice for ``forecast``."""
    part = table[(table["forecast_metric"] == forecast) & (table["group"] == "all")]
    grid = part.pivot_table(index="metric", columns="layer", values="spearman", aggfunc="first")
    if grid.empty or grid.isna().all().all():
        return None
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * grid.shape[1], 1.0 + 0.3 * grid.shape[0]))
    image = ax.imshow(grid.to_numpy(dtype=float), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(grid.shape[1]), grid.columns, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(grid.shape[0]), grid.index, fontsize=7)
    ax.set_title(f"Spearman ρ with {forecast} (all runs)", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03)
    return _save(fig, path)


def trajectories(study: Study, metrics: list[str], factor: str, path: Path) -> Path | None:
    """The last layer's metrics over epochs, one line per run, coloured by ``factor``."""
    table = study.table
    epochs = table.groupby("run")["epoch"].nunique()
    multi = epochs.index[epochs > 1]
    if not len(multi):
        return None
    part = table[table["run"].isin(multi) & (table["probe"] == "isotropy")]
    order = {layer: i for i, layer in enumerate(pd.unique(part["layer"]))}
    last = part.groupby("run")["layer"].agg(lambda s: max(s, key=order.get))
    part = part[part["layer"] == part["run"].map(last)]
    shown = [m for m in metrics if m in set(part["metric"])]
    if not shown:
        return None
    levels = sorted(part[factor].astype(str).unique())
    colours = dict(zip(levels, plt.cm.tab10.colors, strict=False))
    fig, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.2), squeeze=False)
    for ax, metric in zip(axes[0], shown, strict=True):
        for _, line in part[part["metric"] == metric].groupby("run"):
            line = line.sort_values("epoch")
            level = str(line[factor].iloc[0])
            ax.plot(line["epoch"], line["value"], color=colours[level], alpha=0.8, label=level)
        ax.set_title(f"{metric} (last layer)", fontsize=9)
        ax.set_xlabel("epoch")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes[0, 0].legend(unique.values(), unique.keys(), fontsize=7, title=factor)
    return _save(fig, path)


def flow_of_ranks(study: Study, path: Path) -> Path | None:
    """Each model's ε-rank of its blocks' tokens (rank probe, first probe) against relative
    depth, one panel per ε: the rank-structure paper's flow of ranks, models side by side."""
    table = study.table
    part = table[
        (table["probe"] == "rank") & table["metric"].str.fullmatch(r"rank_uncentred_eps[\d.e-]+")
    ]
    part = part[part["layer"].str.fullmatch(BLOCK.pattern) & (part["epoch"] == 0)]
    if part.empty:
        return None
    metrics = sorted(
        part["metric"].unique(), key=lambda m: float(m.removeprefix("rank_uncentred_eps"))
    )
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for (model, _), line in part[part["metric"] == metric].groupby(["model", "run"]):
            order = list(pd.unique(line["layer"]))
            depth = np.linspace(0, 1, len(order)) if len(order) > 1 else np.zeros(1)
            label = f"{model} ({line['dataset'].iloc[0]})"
            ax.plot(depth, line.set_index("layer").loc[order, "value"], marker="o", label=label)
        ax.set_title(f"token {metric} per block", fontsize=9)
        ax.set_xlabel("relative depth (blocks in order, first 0, last 1)", fontsize=8)
    axes[0, 0].set_ylabel("ε-rank")
    axes[0, 0].legend(fontsize=7)
    return _save(fig, path)


def compression(rows: pd.DataFrame, path: Path) -> Path | None:
    """Each run's trade-off (``task=compress``): forecast error ratio against attention size
    ratio, one line per run labelled by its model and data set, each point by its ε."""
    if rows.empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for (_, model, dataset), part in rows.groupby(["run", "model", "dataset"], sort=True):
        part = part.sort_values("epsilon")
        for ax, ratio in zip(axes, ("wql_ratio", "nmse_ratio"), strict=True):
            label = f"{model} · {dataset}"
            ax.plot(part["attention_size_ratio"], part[ratio], marker="o", label=label)
            for _, point in part.iterrows():
                ax.annotate(
                    f"ε={point['epsilon']:g}",
                    (point["attention_size_ratio"], point[ratio]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    for ax, ratio in zip(axes, ("WQL", "NMSE"), strict=True):
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("attention size, compressed / original")
        ax.set_ylabel(f"{ratio}, compressed / original")
        ax.legend(fontsize=8)
    return _save(fig, path)
