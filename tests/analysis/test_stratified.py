"""Stratified associations and the exploration/confirmation split, on constructed studies:
the stratified ρ sees the within-stratum association a pooled ρ hides (Simpson's paradox), and
the confirmation split confirms a planted real association and rejects a planted null."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from isoprobe.analysis.statistics import stratified_spearman
from isoprobe.analysis.stratified import NO_HELD_OUT_GROUP, confirm_findings, split_study
from isoprobe.analysis.study import AnalysisError, Study


def test_one_stratum_is_spearman_and_strata_undo_simpsons_paradox():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=30), rng.normal(size=30)
    rho, p, n, _ = stratified_spearman(x[:, None], y, np.zeros(30), n_perm=200)
    assert rho[0] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12) and n[0] == 30

    strata = np.repeat([0, 1, 2], 15)
    y = rng.normal(size=45) - 3.0 * strata
    x = (y + 0.3 * rng.normal(size=45) + 6.0 * strata)[:, None]  # up within, down between
    assert stats.spearmanr(x[:, 0], y).statistic < 0
    rho, p, _, _ = stratified_spearman(x, y, strata, n_perm=500)
    assert rho[0] > 0.8 and p[0] < 0.01


def _study(rng: np.random.Generator) -> Study:
    """3 data sets x 2 models x 10 seeds, one probed block: ``cos_inter`` follows the error in
    every run (real), ``isoscore`` only on data sets A and B (a finding of the exploration runs
    that C, held out, does not share), ``eff_dim`` never."""
    runs, table = [], []
    for dataset in "ABC":
        for model in ("m1", "m2"):
            for seed in range(10):
                run = f"{dataset}-{model}-{seed}"
                error = float(rng.uniform())
                runs.append(
                    {
                        "run": run,
                        "model": model,
                        "dataset": dataset,
                        "seed": seed,
                        "before_test_nmse": error,
                    }
                )
                values = {
                    "cos_inter": error + 0.05 * rng.normal(),
                    "isoscore": (error if dataset != "C" else rng.uniform()) + 0.05 * rng.normal(),
                    "eff_dim": rng.uniform(),
                }
                table += [
                    {
                        "run": run,
                        "probe": "isotropy",
                        "epoch": 0,
                        "global_step": 0,
                        "layer": "encoder.0",
                        "metric": metric,
                        "value": value,
                    }
                    for metric, value in values.items()
                ]
    return Study(pd.DataFrame(table), pd.DataFrame(runs), ["before_test_nmse"], pd.DataFrame())


def test_the_confirmation_split_confirms_a_real_association_and_rejects_a_null():
    study = _study(np.random.default_rng(1))
    found = confirm_findings(study, ["C"], n_perm=2000, seed=0).table
    pooled = found[found["group"].isin(["all", "model=m1", "model=m2"])]
    real = pooled[pooled["metric"] == "cos_inter"]
    null = found[found["metric"] == "isoscore"]
    assert set(real["group"]) == {"all", "model=m1", "model=m2"} and real["holds"].all()
    assert set(null["group"]) >= {"all", "model=m1", "model=m2"} and not null["holds"].any()
    # a data set held out has no runs in the groups of the other data sets: nothing to confirm
    others = found[found["group"].str.startswith("dataset=")]
    assert len(others) and others["holds"].isna().all() and (others["confirm_n"] == 0).all()
    assert (others["untested"] == NO_HELD_OUT_GROUP).all()


def test_a_split_that_holds_out_no_run_or_every_run_is_refused():
    study = _study(np.random.default_rng(2))
    with pytest.raises(AnalysisError, match=r"analyze.confirm=\['Z'\] holds out 0 of 60 runs"):
        split_study(study, ["Z"])
    explore, held = split_study(study, ["C", "9"])  # a data set and a seed
    assert len(held.runs) == 20 + 4 and len(explore.runs) == 36
