"""The papers' experiments as configs: every sweep value composes, and each ends with analysis."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from isoprobe.models.compression import flow_of_ranks_schedule
from isoprobe.tasks.finetune import FINETUNE
from isoprobe.tasks.probe import PROBE
from isoprobe.tasks.task import task_of
from tests.conftest import CONFIG_DIR, compose_config

#: the studies that are one run writing their own report, not a sweep and its analysis
ONE_RUN_STUDIES = {"rank/embedding_spectra": "embedding_spectra"}
EXPERIMENTS = sorted(
    str(p.relative_to(CONFIG_DIR / "experiment").with_suffix(""))
    for p in (CONFIG_DIR / "experiment").glob("*/*.yaml")
    if str(p.relative_to(CONFIG_DIR / "experiment").with_suffix("")) not in ONE_RUN_STUDIES
)
#: searches (hydra/sweeper=search, Optuna) sample their params instead of sweeping a grid
SEARCHES = [name for name in EXPERIMENTS if name.startswith("search/")]
STUDIES = [name for name in EXPERIMENTS if name not in SEARCHES]


@pytest.mark.parametrize("study", STUDIES)
def test_every_value_of_a_study_sweep_composes_and_the_sweep_ends_with_analysis(tmp_path, study):
    cfg = compose_config(tmp_path, [f"experiment={study}"])
    assert cfg.hydra.callbacks.analyze._target_ == "isoprobe.tasks.sweep_analysis.AnalyzeSweep"
    grids = [cfg.hydra.sweeper.params or {}]
    grids = [{**grids[0], **grid} for grid in cfg.hydra.sweeper.get("grids") or [{}]]
    assert all(grids), f"{study} sweeps nothing"
    for grid in grids:
        fixed = [f"{key}={values}" for key, values in grid.items() if "," not in str(values)]
        for key, values in grid.items():
            for value in str(values).split(","):
                overrides = [f"experiment={study}", *fixed, f"{key}={value}"]
                composed = compose_config(tmp_path, overrides)
                assert task_of(composed).name == composed.task.name
                if key == "model":
                    name = value.split("/")[-1].removesuffix("_from_scratch")
                    assert composed.model.name == name


@pytest.mark.parametrize("search", SEARCHES)
def test_every_bound_and_choice_of_a_search_composes_and_it_has_an_objective(tmp_path, search):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep

    cfg = compose_config(tmp_path, [f"experiment={search}"])
    assert cfg.hydra.sweeper._target_.endswith("SearchSweeper") and cfg.objective
    assert cfg.hydra.callbacks.analyze._target_ == "isoprobe.tasks.sweep_analysis.AnalyzeSweep"
    parser = OverridesParser.create()
    params = parser.parse_overrides([f"{k}={v}" for k, v in cfg.hydra.sweeper.params.items()])
    assert params
    for param in params:
        sweep = param.value()
        assert isinstance(sweep, ChoiceSweep | IntervalSweep), param
        values = sweep.list if isinstance(sweep, ChoiceSweep) else [sweep.start, sweep.end]
        for value in values:
            key = param.key_or_group
            composed = compose_config(tmp_path, [f"experiment={search}", f"{key}={value}"])
            assert OmegaConf.select(composed, key) == pytest.approx(value), key


@pytest.mark.parametrize("study", sorted(ONE_RUN_STUDIES))
def test_a_one_run_study_composes_into_its_task_without_a_sweep(tmp_path, study):
    cfg = compose_config(tmp_path, [f"experiment={study}"])
    assert (CONFIG_DIR / "experiment" / f"{study}.yaml").is_file()
    assert task_of(cfg).name == cfg.task.name == ONE_RUN_STUDIES[study]
    assert not cfg.hydra.sweeper.params and "analyze" not in (cfg.hydra.callbacks or {})


def test_the_context_length_study_runs_each_models_own_arm(tmp_path):
    """Figures 4, 5 and 8: Chronos-T5 on the synthetic sets at 500 / 100 steps and Lag-Llama
    on the real sets at 144 / 96, in one sweep (hydra/sweeper=grids), without the cross terms."""
    cfg = compose_config(tmp_path, ["experiment=isotropy/context_length"])
    assert cfg.hydra.sweeper._target_.endswith("GridsSweeper")
    chronos, lag_llama = cfg.hydra.sweeper.grids
    assert chronos.model == "chronos" and lag_llama.model == "lag_llama"
    assert all(d.startswith("kernelsynth/") for d in chronos.data.split(","))
    assert all(d.startswith("real/") for d in lag_llama.data.split(","))
    assert len(chronos.data.split(",")) == 10 and len(lag_llama.data.split(",")) == 12
    assert str(chronos["data.context_length"]) == "500,100"
    assert str(lag_llama["data.context_length"]) == "144,96"


def test_patchtst_from_scratch_trains_inside_a_zero_shot_grid(tmp_path):
    cfg = compose_config(
        tmp_path, ["experiment=isotropy/real_grid", "model=study/patchtst_from_scratch"]
    )
    assert cfg.task.name == "finetune" and cfg.model.checkpoint == "scratch"
    assert task_of(cfg) is FINETUNE
    zero_shot = compose_config(tmp_path, ["experiment=isotropy/real_grid"])
    assert zero_shot.task.name == "probe" and task_of(zero_shot) is PROBE


def test_the_constant_rank_arm_has_the_flow_arms_attention_size_on_the_mini(tmp_path):
    cfg = compose_config(tmp_path, ["experiment=rank/low_rank_pretraining"])
    shape = cfg.model.sizes[cfg.model.size]
    layers = shape.num_layers
    half = shape.num_heads * shape.d_kv // 2
    flow = flow_of_ranks_schedule(layers, cfg.model.low_rank.r_first, half, 0.5)
    constant = compose_config(
        tmp_path, ["experiment=rank/low_rank_pretraining", "low_rank@model.low_rank=constant"]
    ).model.low_rank
    assert constant.r_first == constant.r_last == round(sum(flow) / len(flow))
