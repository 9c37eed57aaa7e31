"""``task=analyze``: read a sweep's runs and say whether their geometry tracks forecast error.

Writes to its own run directory: ``study.csv`` / ``study.parquet`` (the tidy table),
``primary.csv`` (the declared question's tests, :mod:`isoprobe.analysis.family`),
``correlations.csv`` (across runs), ``within_run.csv`` and ``within_run_summary.csv`` (over
epochs, fine-tuning runs), ``forecast_by_setting.csv`` (runs that differ in seed) and
``compression.csv`` (``task=compress`` runs), ``geometry_change.csv`` (how far training moved
the geometry per swept setting), ``selection.csv`` (label-free model selection,
:mod:`isoprobe.analysis.selection`), ``model_similarity.csv`` and
``model_similarity/pair<i>.png`` (model against model,
:mod:`isoprobe.analysis.model_similarity`), the stratified, readout, drift and (with
``analyze.confirm``) confirmation tables, the figures, and ``report.html``
(:mod:`isoprobe.analysis.study_report`); when W&B is
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
    summarise_within_runs,
    within_runs,
)
from isoprobe.analysis.depth import DRIFT, READOUT, drift_against_gain, geometry_against_readout
from isoprobe.analysis.family import PRIMARY, Question
from isoprobe.analysis.model_similarity import MIN_WINDOWS
from isoprobe.analysis.model_similarity_report import model_against_model
from isoprobe.analysis.selection import epochs_of_a_run, models_on_a_data_set
from isoprobe.analysis.stratified import confirm_findings, stratified_associations
from isoprobe.analysis.study import AnalysisError, Study, load_study
from isoprobe.analysis.study_report import confirmation_note, write_study_report
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
    models = model_against_model(study, min_windows, output)
    if models:
        written.append("model_similarity.csv")
    if not selection.empty:
        extra["selection.csv"] = (
            "Label-free selection: ranking the candidates (models on a data set; a run's "
            "epochs) by each metric against their ranking by error (mean ρ and top-1 rate over "
            "the tasks; a metric's direction is learned on the other tasks). A metric is worth "
            "something only above the baseline 'best model elsewhere' (each model's rank on the "
            "other data sets); models_constant: the share of models within which the metric takes "
            "one value (1: it only says which model a run is)",
            selection,
        )
    report = write_study_report(
        study, table, summary, question, drawn, extra, output, notes, models
    )
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
        notes.append(confirmation_note(held, confirmation))
        found["confirmation.csv"] = (
            f"Exploration/confirmation (held out: runs of {held}): the exploration runs' "
            "findings (q < 0.05 in the question or the scan), each tested once on the held-out "
            "runs; 'holds' = same sign and BH q < 0.05 over the findings tested; 'untested' "
            "says why the held-out runs could not test one",
            confirmation.table,
        )
    return found


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
