"""The analysis figures, as PNG files (matplotlib, no display needed).

Drawn to stay legible at the size of a study (sixty runs and more): where runs are many, lines
are coloured by model or by a setting rather than one colour per run, and the runs of a model
are drawn as its median with their range; legends sit below the panels, never over the data;
figures fit the report's column where they can and are saved whole. Names from runs are drawn
as they are (no mathtext: a ``$`` in a data set's name is a dollar sign)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from isoprobe.analysis.correlations import (  # noqa: E402
    ACROSS_MODELS,
    PAIRED_PROBE,
    geometry_at,
)
from isoprobe.analysis.model_similarity import ModelPair  # noqa: E402
from isoprobe.analysis.study import PROBE_TIME, Study, probes_per_run  # noqa: E402
from isoprobe.metrics.rank import TOKEN_WIDTH, token_rank_epsilon  # noqa: E402
from isoprobe.models.layers import is_block, parse_layer  # noqa: E402

#: at most this many lines are told apart one colour each (compression); beyond, per model
MAX_LINES_APART = 10
#: the report's column in inches at the saved resolution (1200 px at 110 dpi): a figure no
#: wider is shown at its own size, so that its 7-9 pt labels stay readable
PAGE_WIDTH = 10.9
#: a tick label's longest length, and the width in inches of one of its characters at 7 pt
MAX_TICK_CHARS, TICK_CHAR_WIDTH = 40, 0.065


def _plain_text(draw: Callable[..., Path | None]) -> Callable[..., Path | None]:
    """``draw`` with every text it makes, saving included, shown as written (no mathtext)."""

    @functools.wraps(draw)
    def drawn(*args, **kwargs):
        with plt.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return drawn


def _figure(rows: int, columns: int, width: float, height: float):
    """A figure of ``rows`` × ``columns`` panels whose layout makes room for every label and
    for a legend placed outside the panels (:func:`_legend_below`)."""
    return plt.subplots(rows, columns, figsize=(width, height), squeeze=False, layout="constrained")


def _panels(count: int, width: float, height: float):
    """A figure of ``count`` panels of ``width`` × ``height`` inches, as many to a row as fit
    the page (:data:`PAGE_WIDTH`); the panels in order, the spare ones hidden."""
    columns = max(1, min(count, int(PAGE_WIDTH // width)))
    rows = -(-count // columns)
    fig, axes = _figure(rows, columns, width * columns, height * rows)
    for ax in axes.flat[count:]:
        ax.axis("off")
    return fig, list(axes.flat[:count])


def _palette(levels: list) -> dict:
    """A distinct colour per level: tab10 up to ten levels, tab20 up to twenty, else evenly
    spaced along the turbo colour map."""
    if len(levels) <= 10:
        colours = plt.cm.tab10.colors
    elif len(levels) <= 20:
        colours = plt.cm.tab20.colors
    else:
        colours = plt.cm.turbo(np.linspace(0.05, 0.95, len(levels)))
    return dict(zip(levels, colours, strict=False))


#: line styles that, with tab10's ten colours, tell up to forty lines apart
LINE_STYLES = ("-", "--", ":", "-.")


def line_styles(levels: list) -> dict:
    """A distinct (colour, line style) per level: tab10's ten colours solid, then again dashed,
    dotted, dash-dotted (tab20's paired shades are too alike to tell apart on a line)."""
    colours = plt.cm.tab10.colors
    return {
        level: (colours[i % 10], LINE_STYLES[i // 10 % len(LINE_STYLES)])
        for i, level in enumerate(levels)
    }


def _legend_below(fig, handles: list, labels: list[str], title: str | None = None) -> None:
    """One legend for the whole figure, centred under its panels, as many columns as fit."""
    columns = max(1, min(len(labels), int(fig.get_figwidth() // 2.2)))
    fig.legend(handles, labels, loc="outside lower center", ncols=columns, fontsize=8, title=title)


def _plain_log(value: float, _position=None) -> str:
    """A log axis's tick as plain text (the figures draw no mathtext): ``0.2``, ``1``, ``50``."""
    return f"{value:g}"


def _plain_log_minor(value: float, _position=None) -> str:
    """A minor tick of a log axis labelled only at 2 and 5 times a power of ten."""
    mantissa = round(value / 10 ** np.floor(np.log10(value)), 6)
    return f"{value:g}" if mantissa in (2, 5) else ""


def _log_y(ax) -> None:
    """A log y axis whose ticks are plain numbers."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_plain_log))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_plain_log_minor))
    ax.tick_params(axis="y", which="both", labelsize=7)


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def _spearman(x: pd.Series, y: pd.Series) -> float:
    """Spearman's ρ of the finite pairs; NaN for fewer than three or a constant side."""
    both = pd.concat([x, y], axis=1).dropna()
    if len(both) < 3 or both.nunique().min() < 2:
        return float("nan")
    return float(both.rank().corr().iloc[0, 1])


@_plain_text
def papers_form(study: Study, forecast: str, metric: str, path: Path) -> Path | None:
    """Per model, one panel: each run's forecast error (log axis) against its last layer's
    ``metric`` (the isotropy paper's figures 3 and 7 as points on one scale), the model's
    Spearman ρ over its runs and their number in the title (no ρ under three runs)."""
    geometry = geometry_at(study, PAIRED_PROBE[forecast.split("_", 1)[0]])
    key = ("isotropy", metric, "last")
    if key not in geometry.columns:
        return None
    runs = study.runs.set_index("run")
    frame = runs[["model", forecast]].join(geometry[key].rename(metric)).dropna()
    frame = frame[frame[forecast] > 0]
    if frame.empty:
        return None
    models = sorted(frame["model"].astype(str).unique())
    colours = _palette(models)
    fig, axes = _panels(len(models), 2.7, 2.5)
    for ax, model in zip(axes, models, strict=True):
        part = frame[frame["model"].astype(str) == model]
        ax.scatter(part[metric], part[forecast], s=14, color=colours[model])
        _log_y(ax)
        rho = _spearman(part[metric], part[forecast])
        found = f"ρ={rho:.2f}, " if np.isfinite(rho) else ""
        ax.set_title(f"{model}\n{found}n={len(part)}", fontsize=8)
        ax.set_xlabel(f"{metric} (last layer)", fontsize=7)
        ax.set_ylabel(f"{forecast} (log)", fontsize=7)
        ax.tick_params(labelsize=7)
    return _save(fig, path)


@_plain_text
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
    fig, axes = _panels(len(keys), 3.6, 3.2)
    models = sorted(runs["model"].dropna().unique())
    colours = _palette(models)
    for ax, key in zip(axes, keys, strict=True):
        for model in models:
            members = [r for r in runs.index[runs["model"] == model] if r in geometry.index]
            ax.scatter(
                geometry.loc[members, key],
                runs.loc[members, forecast],
                s=14,
                color=colours[model],
                label=str(model),
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
        logged = bool((runs[forecast].dropna() > 0).all())
        ax.set_ylabel(f"{forecast}{' (log)' if logged else ''}", fontsize=8)
        if logged:
            _log_y(ax)
    _legend_below(fig, *axes[0].get_legend_handles_labels(), title="model")
    return _save(fig, path)


def _tick_labels(names: pd.Index) -> list[str]:
    """Names as tick labels, each cut to :data:`MAX_TICK_CHARS` characters (an ellipsis marks
    a cut one), so that one long name cannot squeeze the panel to nothing."""
    return [
        n if len(n) <= MAX_TICK_CHARS else n[: MAX_TICK_CHARS - 1] + "…" for n in map(str, names)
    ]


def _heatmap_layers(study: Study, layers: set[str]) -> list[str]:
    """The heatmap's columns among ``layers``: with one model, every layer in the order its
    probe recorded them (embed first), then ``last`` and ``mean``; with several, whose layers
    differ, only :data:`~isoprobe.analysis.correlations.ACROSS_MODELS`."""
    if study.runs["model"].astype(str).nunique() > 1:
        return [layer for layer in ACROSS_MODELS if layer in layers]
    recorded = [layer for layer in pd.unique(study.table["layer"].astype(str)) if layer in layers]
    return recorded + [layer for layer in ("last", "mean") if layer in layers]


def _counts(n: pd.Series) -> str:
    """The runs behind a heatmap column: ``n=12``, or ``n=9–12`` where its cells differ."""
    low, high = int(n.min()), int(n.max())
    return f"n={low}" if low == high else f"n={low}–{high}"


@_plain_text
def heatmap(study: Study, table: pd.DataFrame, forecast: str, path: Path) -> Path | None:
    """ρ (group ``all``) over metric × layer choice for ``forecast``, layers by depth
    (:func:`_heatmap_layers`), each column's number of runs in its label."""
    part = table[(table["forecast_metric"] == forecast) & (table["group"] == "all")]
    part = part[part["spearman"].notna()]
    columns = _heatmap_layers(study, set(part["layer"].astype(str)))
    part = part[part["layer"].astype(str).isin(columns)]
    if part.empty:
        return None
    grid = part.pivot_table(index="metric", columns="layer", values="spearman", aggfunc="first")
    grid = grid[[layer for layer in columns if layer in grid.columns]]
    counts = part.groupby("layer")["n"].agg(_counts)
    metrics = _tick_labels(grid.index)
    names = zip(_tick_labels(grid.columns), grid.columns, strict=True)
    layers = [f"{name} ({counts[layer]})" for name, layer in names]
    margin = TICK_CHAR_WIDTH * max(map(len, metrics))  # the metric names left of the cells
    width = min(PAGE_WIDTH, 1.5 + margin + 0.4 * len(layers))  # many layers: narrower cells
    height = 1.5 + TICK_CHAR_WIDTH * max(map(len, layers)) + 0.3 * len(metrics)
    fig, axes = _figure(1, 1, max(width, 4.0), height)
    ax = axes[0, 0]
    image = ax.imshow(grid.to_numpy(dtype=float), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(len(layers)), layers, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(metrics)), metrics, fontsize=7)
    models = study.runs["model"].astype(str).nunique()
    title = f"Spearman ρ with {forecast} (all runs)"
    if models > 1:
        title += f"\n{models} models pooled: the layers every model has"
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("layer (n: runs with a value)", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.03)
    return _save(fig, path)


def runs_over_epochs(study: Study) -> pd.Index:
    """The runs probed more than once (those with a trajectory)."""
    probes = probes_per_run(study.table)
    return probes.index[probes > 1]


def colour_factor(study: Study, candidates: list[str]) -> str:
    """The first of ``candidates`` whose value differs among the runs with a trajectory (the
    one that tells their lines apart), else the first candidate."""
    runs = study.runs[study.runs["run"].isin(runs_over_epochs(study))]
    for factor in candidates:
        if factor in runs and runs[factor].astype(str).nunique() > 1:
            return factor
    return candidates[0]


@_plain_text
def trajectories(study: Study, metrics: list[str], factor: str, path: Path) -> Path | None:
    """The last layer's metrics against the optimizer step, one line per run probed more than once
    (the others have no trajectory), a distinct colour and line style per level of
    ``factor``; the title says which runs these are."""
    table = study.table
    multi = runs_over_epochs(study)
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
    styles = line_styles(levels)
    fig, axes = _panels(len(shown), 5.0, 3.2)
    for ax, metric in zip(axes, shown, strict=True):
        for _, line in part[part["metric"] == metric].groupby("run"):
            line = line.sort_values(PROBE_TIME)
            level = str(line[factor].iloc[0])
            colour, style = styles[level]
            ax.plot(line[PROBE_TIME], line["value"], style, color=colour, alpha=0.85, label=level)
        ax.set_title(f"{metric} (last layer)", fontsize=9)
        ax.set_xlabel("optimizer step")
        ax.xaxis.get_major_locator().set_params(integer=True)
    models = ", ".join(
        sorted(study.runs.loc[study.runs["run"].isin(multi), "model"].astype(str).unique())
    )
    fig.suptitle(
        f"The {len(multi)} of {len(study.runs)} runs probed more than once (model: "
        f"{models}); the others have no trajectory",
        fontsize=9,
    )
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    _legend_below(fig, list(unique.values()), list(unique), title=factor)
    return _save(fig, path)


#: line styles of a model's stacks, in the order its probe recorded them (encoder, decoder)
STACK_STYLES = ("-", "--", ":", "-.")


def _relative_ranks(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """The rank probe's token ε-ranks of every block at the first probe, each divided by its
    layer's width (``rank_ratio``), with the block's ``stack`` (``encoder`` of ``encoder.3``);
    and the models left out because their runs recorded no width."""
    epsilon = table["metric"].map(token_rank_epsilon)
    rank = table[(table["probe"] == "rank") & (table[PROBE_TIME] == 0)]
    blocks = rank[rank["layer"].astype(str).map(is_block).astype(bool)]
    part = blocks[epsilon.loc[blocks.index].notna()]
    widths = blocks[blocks["metric"] == TOKEN_WIDTH].set_index(["run", "layer"])["value"]
    width = pd.Series(
        widths.reindex(pd.MultiIndex.from_frame(part[["run", "layer"]])).to_numpy(),
        index=part.index,
    )
    part = part.assign(
        model=part["model"].astype(str),
        stack=part["layer"].astype(str).map(lambda name: parse_layer(name)[0]),
        rank_ratio=part["value"] / width,
    )
    missing = part.groupby("model")["rank_ratio"].apply(lambda r: r.isna().all())
    return part[part["rank_ratio"].notna()], sorted(missing.index[missing])


def _block_ranks(part: pd.DataFrame) -> pd.DataFrame:
    """One stack's rank ratios of one ε -> block × run values, blocks in the model's order."""
    order = list(pd.unique(part["layer"]))
    wide = part.pivot_table(index="layer", columns="run", values="rank_ratio", aggfunc="first")
    return wide.loc[order]


@_plain_text
def flow_of_ranks(study: Study, path: Path) -> Path | None:
    """Each model's ε-rank of its blocks' tokens divided by their width (rank probe, first
    probe) against relative depth, one line per stack of blocks (encoder, decoder: a model's
    stacks are not joined), one panel per ε: the rank-structure paper's flow of ranks, models
    of any width side by side. A model run on several data sets is drawn as its median over
    them, its range shaded; models whose runs recorded no width are named, not drawn."""
    part, missing = _relative_ranks(study.table)
    if part.empty:
        return None
    metrics = sorted(part["metric"].unique(), key=token_rank_epsilon)
    models = sorted(part["model"].unique())
    colours = _palette(models)
    stacks = {m: list(pd.unique(part.loc[part["model"] == m, "stack"])) for m in models}
    bands = sum(map(len, stacks.values()))
    shade = float(np.clip(0.75 / bands, 0.06, 0.2))  # fainter the more bands overlap
    fig, axes = _panels(len(metrics), 3.6, 3.4)
    for ax, metric in zip(axes, metrics, strict=True):
        for model in models:
            for stack, style in zip(stacks[model], STACK_STYLES * 4, strict=False):
                chosen = (part["metric"] == metric) & (part["model"] == model)
                ranks = _block_ranks(part[chosen & (part["stack"] == stack)])
                depth = np.linspace(0, 1, len(ranks)) if len(ranks) > 1 else np.zeros(1)
                runs = ranks.shape[1]
                label = f"{model}{f' · {stack}' if len(stacks[model]) > 1 else ''}"
                label += f" ({runs} run{'s' if runs > 1 else ''})"
                colour = colours[model]
                ax.plot(
                    depth, ranks.median(axis=1), style, marker="o", ms=3, color=colour, label=label
                )
                if runs > 1:
                    low, high = ranks.min(axis=1), ranks.max(axis=1)
                    ax.fill_between(depth, low, high, color=colour, alpha=shade, linewidth=0)
        ax.set_title(f"token {metric} per block", fontsize=9)
        ax.set_xlabel("relative depth in its stack (first block 0, last 1)", fontsize=8)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("ε-rank / width")
    title = "model · stack: the median over its runs (data sets), their range shaded"
    if missing:
        title += f"\nnot drawn, no width recorded: {', '.join(missing)}"
    _legend_below(fig, *axes[0].get_legend_handles_labels(), title=title)
    return _save(fig, path)


@_plain_text
def compression(rows: pd.DataFrame, path: Path) -> Path | None:
    """Each run's trade-off (``task=compress``): forecast error ratio against attention size
    ratio, one line per run. Up to :data:`MAX_LINES_APART` runs each have a colour (labelled by
    model and data set) and each point is marked with its ε; beyond, a colour per model, and
    the legend says the order of the ε along each line."""
    if rows.empty:
        return None
    lines = list(rows.groupby(["run", "model", "dataset"], sort=True))
    by_model = len(lines) > MAX_LINES_APART
    keys = [str(model) if by_model else f"{model} · {dataset}" for (_, model, dataset), _ in lines]
    colours = _palette(sorted(set(keys), key=keys.index))
    fig, axes = _panels(2, 5.4, 4.0)
    for key, (_, part) in zip(keys, lines, strict=True):
        part = part.sort_values("epsilon")
        for ax, ratio in zip(axes, ("wql_ratio", "nmse_ratio"), strict=True):
            ax.plot(
                part["attention_size_ratio"],
                part[ratio],
                marker="o",
                color=colours[key],
                alpha=0.6 if by_model else 1.0,
                label=key,
            )
            for _, point in part.iterrows() if not by_model else ():
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
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    epsilons = ", ".join(f"{e:g}" for e in sorted(rows["epsilon"].unique()))
    title = f"model (a line per run; its points ε = {epsilons}, right to left)"
    _legend_below(fig, list(unique.values()), list(unique), title=title if by_model else None)
    return _save(fig, path)


#: what each epoch kind of a model pair's panels shows
EPOCH_KIND_TITLES = {"epoch0": "before training (epoch 0)", "last": "at the last probe"}
#: the one panel of a zero-shot pair (its two epoch kinds are the same probe)
ZERO_SHOT_TITLE = "zero-shot (epoch 0 is the last probe)"


@_plain_text
def model_pair(pair: ModelPair, path: Path) -> Path | None:
    """Debiased linear CKA of every layer of ``pair.model_a`` (rows) against every layer of
    ``pair.model_b`` (columns), one panel per distinct epoch kind (one for a zero-shot pair),
    one shared colour scale 0..1 (a debiased value below 0 is drawn as 0; blank: no value),
    each panel's noise floor in its title."""
    kinds = pair.distinct_kinds()
    if not kinds:
        return None
    first = pair.matrices[kinds[0]]
    rows, columns = _tick_labels(first.index), _tick_labels(first.columns)
    margin = TICK_CHAR_WIDTH * max(map(len, rows))
    width = min(PAGE_WIDTH / len(kinds), 1.2 + margin + 0.22 * len(columns))
    height = 1.6 + TICK_CHAR_WIDTH * max(map(len, columns)) + 0.22 * len(rows)
    fig, axes = _figure(1, len(kinds), width * len(kinds), height)
    image = None
    for ax, kind in zip(axes[0], kinds, strict=True):
        matrix = pair.matrices[kind]
        values = np.ma.masked_invalid(matrix.to_numpy(dtype=float))
        image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(matrix.shape[1]), _tick_labels(matrix.columns), rotation=90, fontsize=6)
        ax.set_yticks(range(matrix.shape[0]), _tick_labels(matrix.index), fontsize=6)
        ax.set_xlabel(pair.model_b, fontsize=8)
        ax.set_ylabel(pair.model_a, fontsize=8)
        title = ZERO_SHOT_TITLE if pair.zero_shot else EPOCH_KIND_TITLES[kind]
        floor = pair.floors.get(kind, float("nan"))
        if np.isfinite(floor):
            title += f"\nnoise floor {floor:.3f}"
        ax.set_title(title, fontsize=9)
    which = "matched seeds" if pair.matched else "no seed shared: every run pair"
    fig.suptitle(
        f"{pair.model_a} against {pair.model_b}: debiased linear CKA on shared windows, mean "
        f"over {pair.run_pairs} run pair{'s' if pair.run_pairs > 1 else ''} ({which})",
        fontsize=9,
    )
    fig.colorbar(image, ax=list(axes[0]), fraction=0.03, label="debiased linear CKA")
    return _save(fig, path)
