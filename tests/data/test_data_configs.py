"""configs/data/** compose (each through its base in configs/_base) into the DataModule, and both
sets of each domain window cleanly."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from isoprobe.data import TimeSeriesDataModule, dataset_spec
from tests.conftest import CONFIG_DIR, data_config

DATA_CONFIGS = sorted(
    str(p.relative_to(CONFIG_DIR / "data").with_suffix(""))
    for p in (CONFIG_DIR / "data").rglob("*.yaml")
)

# domain config: (its two data sets, context, horizon)
DOMAINS = {
    "energy": (("vic_elec", "epf_prices"), 144, 48),
    "weather": (("seattle_weather", "sea_surface_temperature"), 90, 30),
    "finance": (("stocks", "gafa_stock"), 36, 12),
    "healthcare": (("glucose", "pbs"), 72, 12),
    "transport": (("pedestrian", "ansett"), 48, 24),
    "retail": (("aus_retail", "us_retail_employment"), 36, 12),
}


def build(config: str, **overrides) -> TimeSeriesDataModule:
    return instantiate(data_config(config, seed=5, **overrides))


@pytest.mark.parametrize("config", DATA_CONFIGS)
def test_every_data_config_composes_whole_into_its_datamodule(config):
    data = data_config(config, seed=5)
    # only local's path is left to the user
    assert OmegaConf.missing_keys(data) == ({"data.path"} if config == "local" else set())
    # every key is an argument of the DataModule (which checks each value)
    dm = instantiate(data, path="/tmp/series.csv") if config == "local" else instantiate(data)
    assert isinstance(dm, TimeSeriesDataModule) and dm.seed == 5
    assert dm.context_length > 0 and dm.prediction_length > 0


@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_domain_config_windows_both_of_its_sets(domain):
    names, context, horizon = DOMAINS[domain]
    default = build(domain)
    assert default.dataset == names[0] and default.seed == 5 and default.batch_size == 32
    for name in names:
        assert dataset_spec(name).domain == domain
        dm = build(domain, dataset=name)
        assert (dm.context_length, dm.prediction_length) == (context, horizon)
        dm.setup("fit")
        assert min(dm.report["windows"].values()) > 0
        batch = next(iter(dm.val_dataloader()))
        assert batch["context"].shape[1:] == (context,) and batch["target"].shape[1:] == (horizon,)


def test_chronos_benchmark_config_takes_the_authors_windows_per_set():
    default = build("chronos_benchmark")
    assert default.dataset == "australian_electricity"
    assert (default.context_length, default.prediction_length) == (144, 48)
    dominick = build("chronos_benchmark", dataset="dominick", path="/data/dominick.parquet")
    assert (dominick.context_length, dominick.prediction_length) == (24, 8)
    assert dominick.dataset_kwargs == {"path": "/data/dominick.parquet"}
