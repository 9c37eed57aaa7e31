"""``task=analyze``: read a sweep's runs and say whether their geometry tracks forecast error.

Writes to its own run directory: ``study.csv`` / ``study.parquet`` (the tidy table),
``correlations.csv`` (across runs), ``within_run.csv`` and ``within_run_summary.csv`` (over
epochs, fine-tuning runs), ``forecast_by_setting.csv`` (runs that differ in seed) and
``compression.csv`` (``task=compress`` runs), ``geometry_change.csv`` (how far training moved
the geometry per swept setting), ``selection.csv`` (label-free model selection,
:mod:`isoprobe.analysis.selection`), ``model_similarity.csv`` and
``model_similarity/pair<i>.png`` (model against model,
:mod:`isoprobe.analysis.model_similarity`), the figures, and ``report.html``; when W&B is
online, the same table and figures go to one W&B run (``job_type=analysis``) grouped with the
sweep.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from isoprobe.analysis import figures
from isoprobe.analysis.correlations import (
    CORRELATION_COLUMNS,
    correlations,
    groups,
    summarise_within_runs,
    within_runs,
)
from isoprobe.analysis.depth import DRIFT, READOUT, drift_against_gain, geometry_against_readout
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
from isoprobe.analysis.model_similarity import (
    MIN_WINDOWS,
    SHUFFLES,
    ModelPair,
    best_match,
    model_pair_matrices,
    model_similarity,
)
from isoprobe.analysis.report import Html, Section, image_html, join, markup, write_sections
from isoprobe.analysis.selection import epochs_of_a_run, models_on_a_data_set
from isoprobe.analysis.statistics import MIN_RUNS
from isoprobe.analysis.stratified import (
    Confirmation,
    confirm_findings,
    stratified_associations,
)
from isoprobe.analysis.study import AnalysisError, Study, load_study
from isoprobe.analysis.tables import forecast_by_setting, geometry_change, swept_settings
from isoprobe.metrics import metrics_where
from isoprobe.metrics.plugins import import_plugins
from isoprobe.tasks.output_guard import check_analysis_directory
from isoprobe.tasks.run_lock import run_directory_lock
from isoprobe.tasks.task import Task

log = logging.getLogger(__name__)


def __getattr__(name: str) -> tuple[str, ...]:
    # SHOWN_METRICS: the measures the scatter and trajectory figures show, those registered
    # with MetricInfo(shown=True), a plug-in's included, read when asked for
    if name == "SHOWN_METRICS":
        return metrics_where("shown")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def primary_forecast(study: Study, name: str) -> str:
    """``after_<name>`` when every run has it (fine-tuning), else ``final_<name>`` (each run's
    last forecast where zero-shot and trained runs are pooled), else ``before_<name>``; a value
    that is not finite counts as had. Where none is had by every run, the one that the most
    runs have a value of. A run without a value of it is left out of the figures and tables
    made with it, and named (:func:`note_runs_without`)."""
    columns = [f"{when}_{name}" for when in ("after", "final", "before")]
    columns = [column for column in columns if column in study.runs]
    for column in columns:
        odd = [run for run, bad in study.not_finite.items() if column in bad]
        if (study.runs[column].notna() | study.runs["run"].isin(odd)).all():
            return column
    counts = {column: int(study.runs[column].notna().sum()) for column in columns}
    if counts and max(counts.values()) > 0:
        return max(counts, key=counts.__getitem__)
    raise AnalysisError(
        f"no run has forecast metric {name!r}; analyze.forecast_metric is one of "
        f"{sorted({c.split('_', 1)[1] for c in study.forecast_metrics})}"
    )


def check_isotropy_metric(study: Study, metric: str) -> None:
    """Refuse an ``analyze.isotropy_metric`` that the isotropy probe did not record (before
    anything is written), naming the metrics it did; a study without isotropy records (the rank
    probe's alone) has no figure that reads the setting, so it is not checked there."""
    table = study.table
    recorded = set(table.loc[table["probe"] == "isotropy", "metric"].dropna().unique())
    if recorded and metric not in recorded:
        raise AnalysisError(
            f"analyze.isotropy_metric={metric!r} is not among the metrics the isotropy probe "
            f"recorded; choose one of {sorted(recorded)}"
        )


def note_runs_without(study: Study, forecast: str) -> None:
    """Name in :attr:`Study.partly_left_out` each run that lacks the primary forecast metric."""
    for run in study.runs.loc[study.runs[forecast].isna(), "run"]:
        if run not in study.partly_left_out:
            study.partly_left_out[run] = (
                f"no {forecast}: left out of the figures and tables made with it"
            )


def run_analyze(cfg: DictConfig) -> dict[str, Any]:
    """The analysis of ``cfg.analyze.runs`` into ``cfg.paths.output_dir`` (module docstring),
    which must not hold a run's records and is locked while the analysis writes."""
    options = cfg.analyze
    import_plugins(list(options.get("plugins") or []), "analyze.plugins")
    runs = (
        OmegaConf.to_container(options.runs, resolve=True)
        if OmegaConf.is_config(options.runs)
        else options.runs
    )
    if not runs:
        raise AnalysisError(
            "task=analyze needs analyze.runs=<dir>: a multirun directory, a run directory "
            "or a glob (several: analyze.runs='[dir1,dir2]')."
        )
    output = Path(cfg.paths.output_dir).resolve()
    check_analysis_directory(output)
    with run_directory_lock(output):
        return _analyze(cfg, runs, output)


def _analyze(cfg: DictConfig, runs: Any, output: Path) -> dict[str, Any]:
    options = cfg.analyze
    study = load_study(runs, allow_mixed=bool(options.allow_mixed))
    check_isotropy_metric(study, str(options.isotropy_metric))
    study.table.to_csv(output / "study.csv", index=False)
    study.table.to_parquet(output / "study.parquet", index=False)
    written = ["study.csv"]
    drawn: list[tuple[Path, str]] = []
    table = pd.DataFrame(columns=list(CORRELATION_COLUMNS))
    summary = selection = pd.DataFrame()
    forecast = question = None
    if not study.table.empty:
        forecast = primary_forecast(study, str(options.forecast_metric))
        note_runs_without(study, forecast)
        question = Question(str(options.isotropy_metric), forecast)
        table = correlations(
            study,
            n_boot=int(options.n_boot),
            n_perm=int(options.n_perm),
            seed=int(options.seed),
            question=question,
        )
        table[table["family"] == PRIMARY].to_csv(output / "primary.csv", index=False)
        within = within_runs(study)
        within.to_csv(output / "within_run.csv", index=False)
        summary = summarise_within_runs(within)
        summary.to_csv(output / "within_run_summary.csv", index=False)
        drawn = _figures(study, table, forecast, str(options.isotropy_metric), output)
        found = [models_on_a_data_set(study, forecast), epochs_of_a_run(study)]
        found = [part for part in found if not part.empty]
        selection = pd.concat(found, ignore_index=True) if found else pd.DataFrame()
        selection.to_csv(output / "selection.csv", index=False)
        written += ["primary.csv", "correlations.csv", "within_run_summary.csv", "selection.csv"]
    table.to_csv(output / "correlations.csv", index=False)
    extra = _compared_by_forecast(study, output)
    notes: list[str] = []
    if not study.table.empty:
        extra.update(_depth_and_strata(study, options, output, question, notes))
    moved = geometry_change(study)
    if not moved.empty:
        moved.to_csv(output / "geometry_change.csv", index=False)
        extra["geometry_change.csv"] = (
            "How far training moved the geometry: the last block's change from the first "
            "probed epoch to the last, per setting (mean and mean absolute over runs)",
            moved,
        )
    drawn += extra.pop("figures")
    written += list(extra)
    min_windows = int(options.get("min_shared_windows", MIN_WINDOWS))
    models = _model_against_model(study, min_windows, output)
    if models:
        written.append("model_similarity.csv")
    if not selection.empty:
        extra["selection.csv"] = (
            "Label-free selection: ranking the candidates (models on a data set; a run's "
            "epochs) by each metric against their ranking by error (mean ρ and top-1 rate over "
            "the tasks; a metric's direction is learned on the other tasks). A metric is worth "
            "something only above the baseline 'best model elsewhere' (each model's rank on the "
            "other data sets); constant_within_model: the metric only says which model a run is",
            selection,
        )
    report = _report(study, table, summary, question, drawn, extra, output, notes, models)
    _publish_wandb(cfg, table, drawn)
    print(f"\nisoprobe analyze: {len(study.runs)} runs ({len(study.left_out)} left out)")
    for run, why in study.left_out.items():
        print(f"  left out: {study.left_out_dirs.get(run, run)}: {why}")
    for run, why in study.partly_left_out.items():
        print(f"  left out of some tests: {study.paths.get(run, run)}: {why}")
    for note in notes:
        print(f"  {note}")
    for name in (*written, report.name):
        print(f"  {output / name}")
    return {"task": "analyze", "runs": len(study.runs), "left_out": study.left_out}


def _depth_and_strata(
    study: Study,
    options: DictConfig,
    output: Path,
    question: Question | None,
    notes: list[str],
) -> dict[str, Any]:
    """The stratified associations, geometry against readout, drift against gain and, with
    ``analyze.confirm``, the confirmation of the exploration runs' findings: each a CSV and a
    table of the report (file name -> (caption, table)); what the confirmation found goes to
    ``notes`` (the report and the terminal) even when there was nothing to confirm."""
    n_perm, seed = int(options.n_perm), int(options.seed)
    found: dict[str, Any] = {}
    parts = {
        "stratified.csv": (
            "Rank associations that do not mix levels: Spearman's ρ inside each model and "
            "inside each data set, combined (weighted by runs; p by permuting within them), on "
            "the layer choices that mean the same in every model (embed, first, middle, last, "
            "mean); q over the table's exploratory tests (the 20 lowest q)",
            stratified_associations(study, n_perm, seed),
        ),
        "geometry_readout.csv": (
            f"Per-layer geometry against per-layer readout error ({READOUT}): ρ across each "
            "run's layers, combined over runs",
            geometry_against_readout(study, n_perm, seed),
        ),
        "drift_gain.csv": (
            f"Drift from epoch 0 ({DRIFT} at the last probe) against the forecast gain of "
            "fine-tuning (1 - after / before), across runs: pooled and within model",
            drift_against_gain(study, n_perm, seed),
        ),
    }
    for name, (caption, frame) in parts.items():
        if frame.empty:
            continue
        frame.to_csv(output / name, index=False)
        shown = frame.sort_values("q_value").head(20) if "q_value" in frame else frame
        found[name] = (caption, shown)
    confirm = options.get("confirm")
    if confirm:
        held = [confirm] if isinstance(confirm, str | int) else list(confirm)
        confirmation = confirm_findings(study, held, n_perm, seed, question)
        confirmation.table.to_csv(output / "confirmation.csv", index=False)
        notes.append(_confirmation_note(held, confirmation))
        found["confirmation.csv"] = (
            f"Exploration/confirmation (held out: runs of {held}): the exploration runs' "
            "findings (q < 0.05 in the question or the scan), each tested once on the held-out "
            "runs; 'holds' = same sign and BH q < 0.05 over the findings tested; 'untested' "
            "says why the held-out runs could not test one",
            confirmation.table,
        )
    return found


def _confirmation_note(held: list[Any], confirmation: Confirmation) -> str:
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


def _compared_by_forecast(study: Study, output: Path) -> dict[str, Any]:
    """The tables of runs compared by their forecasts alone, each also a CSV: the forecast
    by setting over seeds, and the compression rows (with their figure)."""
    found: dict[str, Any] = {"figures": []}
    by_setting = forecast_by_setting(study)
    if not by_setting.empty:
        by_setting.to_csv(output / "forecast_by_setting.csv", index=False)
        found["forecast_by_setting.csv"] = (
            "Forecast metrics by setting: mean and sd over seeds",
            by_setting,
        )
    if not study.compression.empty:
        study.compression.to_csv(output / "compression.csv", index=False)
        found["compression.csv"] = (
            "Compression by truncated SVD at each ε: ratios compressed / original "
            "(rank-structure paper, table 2)",
            study.compression,
        )
        found["figures"].append(
            (
                figures.compression(study.compression, output / "compression.png"),
                "Compression: forecast error ratio against attention size ratio, per run",
            )
        )
    return found


def _figures(
    study: Study, table: pd.DataFrame, forecast: str, metric: str, output: Path
) -> list[tuple[Path, str]]:
    factor = figures.colour_factor(study, [*swept_settings(study), "model", "dataset"])
    made = [
        (
            figures.papers_form(study, forecast, metric, output / "papers_form.png"),
            f"Per model: each run's {forecast} (log) against its last layer's {metric}, with "
            "the model's Spearman ρ and number of runs",
        ),
        (
            figures.scatter(
                study, table, forecast, list(metrics_where("shown")), output / "scatter.png"
            ),
            f"{forecast} against each metric of the last layer, coloured by model",
        ),
        (
            figures.heatmap(study, table, forecast, output / "heatmap.png"),
            f"Spearman ρ with {forecast} over metric × layer (all runs; n per layer; several "
            "models: the layer choices every model has)",
        ),
        (
            figures.trajectories(
                study, list(metrics_where("shown")[:4]), factor, output / "trajectories.png"
            ),
            f"The last layer's metrics over epochs of the runs probed at more than one epoch "
            f"(the others have no trajectory), coloured by {factor}",
        ),
        (
            figures.flow_of_ranks(study, output / "flow_of_ranks.png"),
            "Flow of ranks: each model's token ε-rank per block against relative depth "
            "(the median over its runs, the range shaded)",
        ),
    ]
    return [(path, caption) for path, caption in made if path is not None]


def _report(
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
    combined = asked[asked["group"] == WITHIN_MODEL]
    if combined.empty or combined["family"].iloc[0] == UNDEFINED:
        why = combined["undefined"].iloc[0] if len(combined) else "the study lacks the metric"
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
        f"The question: {question.describe()}",
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


#: at most this many model pairs get a heatmap in the report (the rest: model_similarity.csv)
MAX_MODEL_PAIR_FIGURES = 28


def _model_against_model(study: Study, min_windows: int, output: Path) -> list[Html]:
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
    lines = [_pair_line(pair) for pair in pairs]
    if lines:
        section.append(markup("<ul>{lines}</ul>", lines=join(lines)))
    section += _notes(table)
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


def _notes(table: pd.DataFrame) -> list[Html]:
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


def _pair_line(pair: ModelPair) -> Html:
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


def _publish_wandb(cfg: DictConfig, table: pd.DataFrame, drawn: list[tuple[Path, str]]) -> None:
    """One W&B run (``job_type=analysis``) with the table and figures, only when W&B is
    online (a key is set and WANDB_MODE is neither offline nor disabled)."""
    logger = cfg.get("logger") or {}
    if "wandb" not in logger or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return
    import wandb

    if not wandb.login(prompt=False):  # no key: nothing to publish to
        return
    settings = logger["wandb"]
    run = wandb.init(
        project=settings.get("project"),
        job_type="analysis",
        group=str(cfg.analyze.get("group") or Path(str(cfg.analyze.runs)).name),
        name=f"analysis-{Path(cfg.paths.output_dir).name}",
    )
    run.log(
        {
            "correlations": wandb.Table(dataframe=table),
            **{path.stem: wandb.Image(str(path), caption=caption) for path, caption in drawn},
        }
    )
    run.finish()


ANALYZE = Task("analyze", trains=False, alone=run_analyze)
