"""``report.html`` of ``task=analyze``: the page, the question first.

The opening (what was analysed, the runs left out), the declared question and its answer
(:mod:`isoprobe.analysis.family`), the figures, the exploratory scan labelled as such (what its
family holds, its findings), the further tables, model against model, and the runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from isoprobe.analysis.correlations import groups
from isoprobe.analysis.family import (
    ALPHA,
    CORRECTED,
    DESCRIPTIVE,
    EXPLORATORY,
    PRIMARY,
    REPEAT,
    UNDEFINED,
    WITHIN_MODEL,
    Question,
    family_counts,
    findings,
)
from isoprobe.analysis.report import Html, Section, join, markup, write_sections
from isoprobe.analysis.statistics import MIN_RUNS
from isoprobe.analysis.stratified import Confirmation
from isoprobe.analysis.study import Study


def write_study_report(
    study: Study,
    table: pd.DataFrame,
    within: pd.DataFrame,
    question: Question | None,
    drawn: list[tuple[Path, str]],
    extra: dict[str, tuple[str, pd.DataFrame]],
    output: Path,
    notes: list[str],
    models: list[Html],
) -> Path:
    """The page, the question first: the opening, the declared question and its answer, the
    figures, the exploratory scan (labelled as such), the other tables, model against model,
    and the runs."""
    forecast = question.forecast if question else None
    primary = (
        markup(" Primary forecast metric: <b>{forecast}</b> (lower is better).", forecast=forecast)
        if forecast
        else markup(
            " No run has probe records, so there are no correlations: the tables below "
            "compare the runs by their forecasts."
        )
    )
    opening = markup(
        "<p>{n} runs analysed: models {models}, data sets {datasets}.{primary}</p>",
        n=len(study.runs),
        models=", ".join(sorted(study.runs["model"].astype(str).unique())),
        datasets=", ".join(sorted(study.runs["dataset"].astype(str).unique())),
        primary=primary,
    )
    paragraphs: list[Html] = [opening, *_runs_not_in_the_tests(study, forecast)]
    sections = [Section(None, paragraphs)]
    if question is not None:
        sections.append(_the_question(table, question))
    if drawn:
        sections.append(Section("Figures", (), drawn))
    if question is not None:
        sections.append(_the_scan(study, table, forecast))
    further = [markup("<p class='note'>{note}</p>", note=note) for note in notes]
    if extra or further:
        sections.append(Section("Further tables", further, (), list(extra.values())))
    if models:
        sections.append(Section(None, models))
    tables = [("Runs", study.runs)]
    if not within.empty:
        tables.append(("Within runs: trajectory against validation error", within))
    sections.append(Section("Runs", (), (), tables))
    return write_sections(output / "report.html", "isoprobe analysis", sections)


def _runs_not_in_the_tests(study: Study, forecast: str | None) -> list[Html]:
    """Runs without probe records, runs left out (wholly or in part), paths with no run."""
    paragraphs = []
    if study.unprobed and forecast:
        paragraphs.append(
            markup(
                "<p>{n} runs without probe records are in the tables, not in the correlations: "
                "{runs}.</p>",
                n=len(study.unprobed),
                runs=", ".join(study.unprobed),
            )
        )
    if study.left_out:
        listed = join(
            markup("<li>{run}: {why}</li>", run=run, why=why) for run, why in study.left_out.items()
        )
        paragraphs.append(
            markup(
                "<p>{n} runs left out:</p><ul>{listed}</ul>", n=len(study.left_out), listed=listed
            )
        )
    return paragraphs + _partly_left_out(study)


#: the columns of the question's table in the report
QUESTION_COLUMNS = [
    "group",
    "n",
    "spearman",
    "spearman_lo",
    "spearman_hi",
    "p_value",
    "q_value",
    "family",
    "undefined",
]


def _the_question(table: pd.DataFrame, question: Question) -> Section:
    """The declared question, its tests and its answer (:mod:`isoprobe.analysis.family`)."""
    asked = table[question.asks(table)]
    heading = f"The question: {question.describe()}"
    if asked.empty:
        return Section(
            heading,
            [
                markup(
                    "<p class='note'>Not asked in this study: no run recorded the {probe} "
                    "measure {metric} (a study of other measures, such as the rank measures "
                    "alone, answers other questions: see the exploration below).</p>",
                    probe=question.probe,
                    metric=question.metric,
                )
            ],
        )
    combined = asked[asked["group"] == WITHIN_MODEL]
    if combined.empty or combined["family"].iloc[0] == UNDEFINED:
        why = combined["undefined"].iloc[0] if len(combined) else "no run has the forecast"
        answer = markup("<p><b>No answer within model</b>: {why}.</p>", why=why)
    else:
        row = combined.iloc[0]
        verdict = (
            "an association at the 0.05 level"
            if row["q_value"] < ALPHA
            else "no evidence of an association at the 0.05 level"
        )
        answer = markup(
            "<p><b>Within model: ρ = {rho:.3f}</b> over {n} runs (p = {p:.3g}, q = {q:.3g}): "
            "{verdict}. ρ &gt; 0: within a model, runs with a larger {metric} forecast worse."
            "</p>",
            rho=float(row["spearman"]),
            n=int(row["n"]),
            p=float(row["p_value"]),
            q=float(row["q_value"]),
            verdict=verdict,
            metric=question.metric,
        )
    explained = markup(
        "<p class='note'>The study's declared question, the papers' own: {asked} Its tests "
        "were fixed before any run was read: the {metric} of the {layer} block against "
        "{forecast}, in each model with enough runs to reach the 0.05 level, and within model "
        "(Spearman's ρ inside each model, combined weighted by runs; p by permuting inside "
        "each model). Their Benjamini–Hochberg q-values are taken over these {k} tests alone "
        "(primary.csv).</p>",
        asked=question.describe(),
        metric=question.metric,
        layer=question.layer,
        forecast=question.forecast,
        k=int((asked["family"] == PRIMARY).sum()),
    )
    return Section(
        heading,
        [explained, answer],
        (),
        [("The question's tests", asked[QUESTION_COLUMNS])],
    )


def _the_scan(study: Study, table: pd.DataFrame, forecast: str) -> Section:
    """The exploratory scan: what its family holds, and its findings."""
    scan = table[table["family"] == EXPLORATORY]
    found = findings(scan)
    shown = (found if len(found) else scan).drop(columns=["undefined", "repeats"])
    shown = shown.sort_values("q_value").head(500)
    heading = (
        f"The scan's findings: the {len(found)} exploratory tests with q < {ALPHA}"
        if len(found)
        else f"No exploratory test reaches q < {ALPHA}: the 500 lowest q-values"
    )
    return Section(
        "Exploration: every other metric, layer, forecast and group (hypotheses, not answers)",
        _reading_correlations(study, table),
        (),
        [(f"{heading} (all tests, every forecast metric, in correlations.csv)", shown)],
    )


def _partly_left_out(study: Study) -> list[Html]:
    """The runs kept but left out of some tests, and the paths that matched no run."""
    paragraphs = []
    if study.partly_left_out:
        listed = join(
            markup("<li>{run}: {why}</li>", run=run, why=why)
            for run, why in study.partly_left_out.items()
        )
        paragraphs.append(
            markup(
                "<p>{n} runs left out of some tests:</p><ul>{listed}</ul>",
                n=len(study.partly_left_out),
                listed=listed,
            )
        )
    if study.unmatched:
        listed = join(markup("<li>{path}</li>", path=path) for path in study.unmatched)
        paragraphs.append(
            markup(
                "<p>Paths of analyze.runs that match no run:</p><ul>{listed}</ul>", listed=listed
            )
        )
    return paragraphs


def _reading_correlations(study: Study, table: pd.DataFrame) -> list[Html]:
    """How to read the scan, what its family holds, and the tests outside it and why (none of
    them is in the Benjamini–Hochberg correction or among the findings)."""
    counts = family_counts(table)
    defined = table["family"] != UNDEFINED
    reasons = table.loc[~defined, "undefined"].value_counts()
    paragraphs = [
        markup(
            "<p class='note'>How to read ρ: Spearman's rank correlation across runs between a "
            "geometry metric (measured on the weights that made the forecast) and the forecast "
            "error. ρ &gt; 0: runs with a larger value forecast worse. The interval is a 95% "
            "percentile bootstrap over runs; an interval that spans 0 does not show an "
            "association. The scan's family holds <b>{scan} tests</b> (metric × layer × "
            "forecast metric × group), corrected together by Benjamini–Hochberg apart from the "
            "question's {primary}: some will look significant by chance, so read "
            "<code>q_value</code>, not <code>p_value</code>, and treat what the scan finds as a "
            "hypothesis to test on new runs (analyze.confirm). Groups that pool several models "
            "compare layers by depth (embed, the first, middle and last block, the mean over "
            "blocks), never by name: a layer name means different things in different "
            "architectures.</p>",
            scan=counts[EXPLORATORY],
            primary=counts[PRIMARY],
        ),
        markup(
            "<p>Outside the family (column <code>family</code> of correlations.csv): "
            "{descriptive} descriptive tests, whose runs are too few for any outcome to reach "
            "the 0.05 level (the smallest permutation p of n runs is 2/n!, 0.083 for 4), so "
            "they describe and are never findings; {repeats} repeats of a test already counted "
            "(the same runs, metric values and forecast values, such as final_* where it equals "
            "after_* or before_*; column <code>repeats</code> names the original); {undefined} "
            "tests with no answer.</p>",
            descriptive=counts[DESCRIPTIVE],
            repeats=counts[REPEAT],
            undefined=counts[UNDEFINED],
        ),
    ]
    small = sorted(
        set(table.loc[table["family"] == DESCRIPTIVE, "group"].astype(str))
        - set(table.loc[table["family"].isin(CORRECTED), "group"].astype(str))
    )
    if small:
        paragraphs.append(
            markup(
                "<p>Groups too small to reach the level, so descriptive only: {groups}.</p>",
                groups=", ".join(small),
            )
        )
    if len(reasons):
        listed = join(
            markup("<li>{reason}: {count}</li>", reason=reason, count=int(count))
            for reason, count in reasons.items()
        )
        paragraphs.append(
            markup(
                "<p>Tests with no answer have no p-value, no q-value and no place among the "
                "findings (the column <code>undefined</code> says why). A constant metric or "
                "forecast has no rank correlation; a measure of the weights alone is not "
                "tested across runs that share their weights, which are one observation of it, "
                "in any table:</p><ul>{listed}</ul>",
                listed=listed,
            )
        )
    tiny = sorted(group for group, members in groups(study).items() if len(members) < MIN_RUNS)
    if tiny:
        paragraphs.append(
            markup(
                "<p>No ρ for groups with fewer than {min_runs} runs: {groups}.</p>",
                min_runs=MIN_RUNS,
                groups=", ".join(tiny),
            )
        )
    return paragraphs


def confirmation_note(held: list[Any], confirmation: Confirmation) -> str:
    """What the exploration/confirmation split found, in one paragraph of plain text."""
    table = confirmation.table
    tested = table["untested"].isna()
    text = (
        f"Confirmation (held out: runs of {', '.join(map(str, held))}): the exploration runs "
        f"made {confirmation.explored} corrected tests and found {len(table)}; "
        f"{int(tested.sum())} were tested on the held-out runs and "
        f"{int(table['holds'].eq(True).sum())} hold; {int((~tested).sum())} could not be tested "
        "there (confirmation.csv says why)."
    )
    if confirmation.small_groups:
        text += (
            " Groups the held-out runs leave too small to reach the level: "
            f"{', '.join(confirmation.small_groups)}."
        )
    return text
