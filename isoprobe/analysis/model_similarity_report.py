"""The "Model against model" part of ``task=analyze``: ``model_similarity.csv``, a heatmap
per pair of models, and the report's section on them
(:mod:`isoprobe.analysis.model_similarity`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from isoprobe.analysis import figures
from isoprobe.analysis.model_similarity import (
    SHUFFLES,
    ModelPair,
    best_match,
    model_pair_matrices,
    model_similarity,
)
from isoprobe.analysis.report import Html, image_html, join, markup
from isoprobe.analysis.study import Study

#: at most this many model pairs get a heatmap in the report (the rest: model_similarity.csv)
MAX_MODEL_PAIR_FIGURES = 28


def model_against_model(study: Study, min_windows: int, output: Path) -> list[Html]:
    """``model_similarity.csv`` and, per pair of models, a heatmap; the report's section on
    them (nothing when no run saved window means)."""
    table = model_similarity(study, min_windows)
    if table.empty:
        return []
    table.to_csv(output / "model_similarity.csv", index=False)
    pairs = model_pair_matrices(table, study.runs)
    section = [
        markup(
            "<h2>Model against model</h2><p class='note'>Debiased linear CKA of every layer of "
            "one run against every layer of another run on the same data, on the probe "
            "windows both saved (each window's mean real token per layer, so that models of "
            "any tokenisation meet on the same windows; at least {min_windows} shared). 1: "
            "the same representation up to rotation, scale and shift. Per pair of models: "
            "the mean over their run pairs with the same seed (every run pair where no seed "
            "is shared). A closest layer is named only above the noise floor: the highest "
            "CKA of any layer pair with one run's windows shuffled ({shuffles} shuffles). "
            "All values: model_similarity.csv.</p>",
            min_windows=min_windows,
            shuffles=SHUFFLES,
        )
    ]
    lines = [pair_line(pair) for pair in pairs]
    if lines:
        section.append(markup("<ul>{lines}</ul>", lines=join(lines)))
    section += notes_of(table)
    directory = output / "model_similarity"
    directory.mkdir(exist_ok=True)
    for i, pair in enumerate(pairs[:MAX_MODEL_PAIR_FIGURES]):
        path = figures.model_pair(pair, directory / f"pair{i}.png")
        if path is not None:
            section.append(image_html(path, f"{pair.model_a} against {pair.model_b}"))
    if len(pairs) > MAX_MODEL_PAIR_FIGURES:
        section.append(
            markup(
                "<p>{n} more pairs of models, not drawn: model_similarity.csv holds them.</p>",
                n=len(pairs) - MAX_MODEL_PAIR_FIGURES,
            )
        )
    return section


def notes_of(table: pd.DataFrame) -> list[Html]:
    """The notes of model_similarity.csv, each with its count of rows: those of rows without a
    value, then those of values computed without some windows."""
    section = []
    headings = {
        True: "Without a value (NaN in the CSV):",
        False: "With a value computed on fewer windows:",
    }
    for undefined, heading in headings.items():
        rows = table[table["cka"].isna() == undefined]
        notes = rows.loc[rows["note"].fillna("") != "", "note"].value_counts()
        if len(notes):
            listed = join(
                markup("<li>{why}: {n} rows</li>", why=why, n=int(n)) for why, n in notes.items()
            )
            section.append(
                markup("<p>{heading}</p><ul>{listed}</ul>", heading=heading, listed=listed)
            )
    return section


def pair_line(pair: ModelPair) -> Html:
    """One model pair: the layer of B closest to A's last layer at each distinct epoch kind
    (one for zero-shot pairs), or that none is above the pair's noise floor."""
    found = []
    for kind in pair.distinct_kinds():
        when = "zero-shot" if pair.zero_shot else figures.EPOCH_KIND_TITLES[kind]
        match = best_match(pair, kind)
        if match is not None:
            found.append(
                markup(
                    "{when}: {layer} (CKA {value:.3f}, noise floor {floor:.3f})",
                    when=when,
                    layer=match[1],
                    value=match[2],
                    floor=pair.floors[kind],
                )
            )
        elif pair.matrices[kind].iloc[-1].notna().any():
            found.append(
                markup(
                    "{when}: none above the noise floor ({floor:.3f})",
                    when=when,
                    floor=pair.floors[kind],
                )
            )
    last = pair.matrices[next(iter(pair.matrices))].index[-1]
    return markup(
        "<li>{a} against {b} ({n} run pair{plural}): the layer of {b} closest to {a}'s last layer "
        "{last}, {found}</li>",
        a=pair.model_a,
        b=pair.model_b,
        n=pair.run_pairs,
        plural="s" if pair.run_pairs > 1 else "",
        last=last,
        found=join(found, "; ") if found else "none defined",
    )
