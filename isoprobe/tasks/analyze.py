"""``task=analyze``: read a sweep's runs and say whether their geometry tracks forecast error.

Writes to its own run directory: ``study.csv`` / ``study.parquet`` (the tidy table),
``correlations.csv`` (across runs), ``within_run.csv`` and ``within_run_summary.csv`` (over
epochs, fine-tuning runs), the figures, and ``report.html``; when W&B is online, the same table
and figures go to one W&B run (``job_type=analysis``) grouped with the sweep.
"""

from __future__ import annotations

import html
import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from isoprobe.analysis import figures
from isoprobe.analysis.correlations import (
    correlations,
    groups,
    summarise_within_runs,
    within_runs,
)
from isoprobe.analysis.report import write_report
from isoprobe.analysis.statistics import MIN_RUNS
from isoprobe.analysis.study import AnalysisError, Study, load_study

log = logging.getLogger(__name__)

#: the isotropy measures the scatter and trajectory figures show
SHOWN_METRICS = (
    "cos_inter",
    "cos_inter_centered",
    "cos_cluster_excess",
    "eff_dim",
    "participation_ratio",
    "isoscore",
    "log_partition_ratio",
    "silhouette",
)


def primary_forecast(study: Study, name: str) -> str:
    """``after_<name>`` when every run has it (fine-tuning), else ``final_<name>`` (each run's
    last forecast: zero-shot runs' ``before``, trained runs' ``after``)."""
    for when in ("after", "final"):
        column = f"{when}_{name}"
        if column in study.runs and study.runs[column].notna().all():
            return column
    raise AnalysisError(
        f"no run has forecast metric {name!r}; analyze.forecast_metric is one of "
        f"{sorted({c.split('_', 1)[1] for c in study.forecast_metrics})}"
    )


def run_analyze(cfg: DictConfig) -> dict[str, Any]:
    options = cfg.analyze
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
    output = Path(cfg.paths.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    study = load_study(runs, allow_mixed=bool(options.allow_mixed))
    study.table.to_csv(output / "study.csv", index=False)
    study.table.to_parquet(output / "study.parquet", index=False)
    table = correlations(
        study, n_boot=int(options.n_boot), n_perm=int(options.n_perm), seed=int(options.seed)
    )
    table.to_csv(output / "correlations.csv", index=False)
    within = within_runs(study)
    within.to_csv(output / "within_run.csv", index=False)
    summary = summarise_within_runs(within)
    summary.to_csv(output / "within_run_summary.csv", index=False)
    forecast = primary_forecast(study, str(options.forecast_metric))
    drawn = _figures(study, table, forecast, str(options.isotropy_metric), output)
    report = _report(study, table, summary, forecast, drawn, output)
    _publish_wandb(cfg, table, drawn)
    print(f"\nisoprobe analyze: {len(study.runs)} runs ({len(study.left_out)} left out)")
    for name in ("study.csv", "correlations.csv", "within_run_summary.csv", report.name):
        print(f"  {output / name}")
    return {"task": "analyze", "runs": len(study.runs), "left_out": study.left_out}


def _figures(
    study: Study, table: pd.DataFrame, forecast: str, metric: str, output: Path
) -> list[tuple[Path, str]]:
    made = [
        (
            figures.papers_form(study, forecast, metric, output / "papers_form.png"),
            f"Per model: {forecast} beside the last layer's {metric}, every data set",
        ),
        (
            figures.scatter(study, table, forecast, list(SHOWN_METRICS), output / "scatter.png"),
            f"{forecast} against each metric of the last layer, coloured by model",
        ),
        (
            figures.heatmap(table, forecast, output / "heatmap.png"),
            f"Spearman ρ with {forecast} over metric × layer (all runs)",
        ),
        (
            figures.trajectories(
                study, list(SHOWN_METRICS[:4]), "model", output / "trajectories.png"
            ),
            "The last layer's metrics over epochs, per run, coloured by model",
        ),
        (
            figures.flow_of_ranks(study, output / "flow_of_ranks.png"),
            "Flow of ranks: each model's token ε-rank per block against relative depth",
        ),
    ]
    return [(path, caption) for path, caption in made if path is not None]


def _report(
    study: Study,
    table: pd.DataFrame,
    within: pd.DataFrame,
    forecast: str,
    drawn: list[tuple[Path, str]],
    output: Path,
) -> Path:
    tested = table["spearman"].notna().sum()
    small = sorted(group for group, members in groups(study).items() if len(members) < MIN_RUNS)
    paragraphs = [
        f"<p>{len(study.runs)} runs analysed: models {sorted(study.runs['model'].unique())}, "
        f"data sets {sorted(study.runs['dataset'].unique())}. Primary forecast metric: "
        f"<b>{html.escape(forecast)}</b> (lower is better).</p>",
        "<p class='note'>How to read ρ: Spearman's rank correlation across runs between a "
        "geometry metric (measured on the weights that made the forecast) and the forecast "
        "error. ρ &gt; 0: runs with a larger value forecast worse. The interval is a 95% "
        "percentile bootstrap over runs; an interval that spans 0 does not show an association. "
        f"<b>{tested} tests</b> (metric × layer × forecast metric × group) are in this table, "
        "so some will look significant by chance: read the Benjamini–Hochberg "
        "<code>q_value</code>, not <code>p_value</code>, and treat a pattern found by "
        "scanning the table as a hypothesis to test on new runs.</p>",
    ]
    if study.left_out:
        listed = "".join(
            f"<li>{html.escape(run)}: {html.escape(why)}</li>"
            for run, why in study.left_out.items()
        )
        paragraphs.append(f"<p>{len(study.left_out)} runs left out:</p><ul>{listed}</ul>")
    if small:
        paragraphs.append(
            f"<p>No ρ for groups with fewer than {MIN_RUNS} runs: "
            f"{html.escape(', '.join(small))} (a rank correlation of so few points can take "
            "only a handful of values).</p>"
        )
    top = table[table["forecast_metric"] == forecast].sort_values("q_value").head(500)
    tables = [
        (f"Correlations with {forecast} (500 lowest q-values; all in correlations.csv)", top),
        ("Runs", study.runs),
    ]
    if not within.empty:
        tables.append(("Within runs: trajectory against validation error", within))
    return write_report(output / "report.html", "isoprobe analysis", paragraphs, drawn, tables)


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
