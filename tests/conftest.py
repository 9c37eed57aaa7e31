"""Shared fixtures: Hydra configs composed for tests (CPU, tiny limits, no network)."""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"

# Everything in the test suite runs offline and quiet.
# Under pytest-xdist (``-n 2``) each worker, and each run it starts, gets one core's share: one
# torch thread. Two workers of two threads each on two cores spin against each other at every
# parallel region and run several times slower than one.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

TINY_RUN = [
    "trainer=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.max_epochs=1",
    "logger=csv",
    "data.max_train_windows=64",
    "data.max_eval_windows=16",
    "data.batch_size=16",
    "callbacks.probe.num_windows=8",
    "callbacks.probe.max_tokens=300",
    "callbacks.probe.isotropy.metrics.k_max=4",
    # no per-run pictures (a third of a tiny run's time): the tests of the pictures ask for them
    "callbacks.probe.figures_every_n_epochs=-1",
]
#: per model (configs/model/<name>.yaml), the overrides that make it quick in tests
TINY_MODEL: dict[str, list[str]] = {
    "chronos": ["model.num_samples=4"],
    "chronos_bolt": [
        "model.sizes.mini.d_model=32",
        "model.sizes.mini.d_kv=8",
        "model.sizes.mini.d_ff=64",
        "model.sizes.mini.num_layers=2",
        "model.sizes.mini.num_decoder_layers=2",
    ],
    "chronos2": [
        "model.sizes.mini.d_model=32",
        "model.sizes.mini.d_ff=64",
        "model.sizes.mini.num_layers=2",
    ],
    "patchtst": ["model.sizes.paper.d_model=16", "model.sizes.paper.ffn_dim=32"],
    "moirai": ["model.num_samples=20", "model.sizes.mini.num_layers=2"],
    "lag_llama": ["model.num_samples=4", "model.sizes.mini.n_layer=2", "model.sizes.mini.n_head=2"],
    "timesfm": [
        "model.sizes.mini.num_hidden_layers=2",
        "model.sizes.mini.hidden_size=32",
        "model.sizes.mini.intermediate_size=32",
        "model.sizes.mini.head_dim=8",
    ],
    "visionts": [
        "model.sizes.mini.width=32",
        "model.sizes.mini.depth=2",
        "model.sizes.mini.decoder_depth=1",
    ],
    "time_moe": [
        "model.sizes.mini.hidden_size=32",
        "model.sizes.mini.intermediate_size=32",
        "model.sizes.mini.num_hidden_layers=2",
        "model.sizes.mini.num_attention_heads=2",
    ],
    "timesfm25": [
        "model.sizes.mini.model_dims=32",
        "model.sizes.mini.hidden_dims=32",
        "model.sizes.mini.num_layers=2",
        "model.sizes.mini.num_heads=2",
    ],
    "moirai2": [
        "model.sizes.mini.d_model=64",
        "model.sizes.mini.d_ff=32",
        "model.sizes.mini.num_layers=2",
    ],
    "tirex": [
        "model.sizes.mini.embedding_dim=32",
        "model.sizes.mini.num_heads=2",
        "model.sizes.mini.num_blocks=2",
        "model.sizes.mini.input_ff_dim=32",
        "model.sizes.mini.train_ctx_len=128",
    ],
    "toto": [
        "model.num_samples=4",
        "model.sizes.mini.embed_dim=32",
        "model.sizes.mini.mlp_hidden_dim=32",
        "model.sizes.mini.num_layers=2",
        "model.sizes.mini.num_heads=2",
        "model.sizes.mini.spacewise_every_n_layers=2",
    ],
    "sundial": [
        "model.num_samples=4",
        "model.sizes.mini.hidden_size=32",
        "model.sizes.mini.intermediate_size=32",
        "model.sizes.mini.num_hidden_layers=2",
        "model.sizes.mini.num_attention_heads=2",
        "model.sizes.mini.num_sampling_steps=4",
    ],
    "llm": [
        "model.num_samples=4",
        "model.sizes.gpt2.mini.n_embd=32",
        "model.sizes.gpt2.mini.n_layer=2",
        "model.sizes.gpt2.mini.n_head=2",
    ],
}


def tiny_for(model: str) -> list[str]:
    """The tiny CPU overrides for ``model=<model>``."""
    return [*TINY_RUN, f"model={model}", *TINY_MODEL.get(model, [])]


TINY = tiny_for("chronos")


def wandb_home_env(tmp_path: Path) -> dict[str, str]:
    """Environment that keeps W&B's files (runs, cache, settings) under tmp_path."""
    names = ("WANDB_DIR", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR")
    return {name: str(tmp_path / "wandb-home") for name in names}


def wandb_records(offline_run: Path) -> list[dict]:
    """Every record of an offline W&B run directory, as ``wandb leet inspect --json`` prints
    them (one JSON object per line)."""
    cli = Path(sys.executable).with_name("wandb")
    done = subprocess.run(
        [str(cli), "leet", "inspect", "--json", str(offline_run)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


#: the test modules whose tests share a fixture the module builds once (a sweep of real runs, an
#: analysis): under pytest-xdist each one's tests go to one worker together (OneWorkerPerModule),
#: so that the fixture is built once rather than once in each worker. A module that gains such a
#: fixture is refused at collection until it is listed here.
SHARED_FIXTURE_MODULES = frozenset(
    {
        "tests/analysis/test_analyze.py",
        "tests/analysis/test_figures_at_scale.py",
        "tests/analysis/test_report_escaping.py",
        "tests/analysis/test_study_design.py",
        "tests/analysis/test_undefined_tests.py",
        "tests/models/test_totem.py",
        "tests/tasks/test_output_guard.py",
        "tests/tasks/test_peak_memory.py",
    }
)


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture its module builds once for all its tests."""
    return any(
        definitions[-1].scope == "module"
        for definitions in item._fixtureinfo.name2fixturedefs.values()
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuse a module with a shared fixture that SHARED_FIXTURE_MODULES does not list. Under
    pytest-xdist, the slow end-to-end tests first: they are a handful of tests taking half the
    suite's time, and queued last they would leave one worker running them alone while the
    other idles. Every worker collects the same order, as xdist requires."""
    unlisted = {
        item.path.relative_to(ROOT).as_posix() for item in items if shares_a_module_fixture(item)
    } - SHARED_FIXTURE_MODULES
    if unlisted:
        raise pytest.UsageError(
            f"{sorted(unlisted)} build a module-scoped fixture: list them in "
            "tests/conftest.py's SHARED_FIXTURE_MODULES"
        )
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's ``--dist load`` (pyproject's addopts) with each of SHARED_FIXTURE_MODULES's tests
    handed to one worker as one unit: xdist's loadscope scheduler, its scope a listed module or
    else the test alone. It queues the modules first (the largest first), then the other tests
    one at a time in collection order, each to the worker that is running out of tests.
    (xdist's own ``--dist loadgroup`` marks no group under pytest 9, which names a test by
    ``_id`` where xdist appends the group to ``_nodeid``.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerPerModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_FIXTURE_MODULES else nodeid

    return OneWorkerPerModule(config, log)


def run_py_at(*overrides: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python run.py <overrides>`` started in ``cwd`` (with ``env`` added to this process's
    environment), its output captured; the caller checks the return code."""
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        env=None if env is None else {**os.environ, **env},
    )


@functools.cache
def composed(overrides: tuple[str, ...], hydra: bool) -> DictConfig:
    """The config of ``overrides`` (with Hydra's own section when ``hydra``), composed once per
    test process: a compose reads and merges the whole config tree (a fifth of a second), and
    the suite composes the same few hundred override lists again and again. The callers take a
    deep copy (a twentieth of the time)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra)


def compose_config(tmp_path: Path, overrides: list[str]) -> DictConfig:
    """The run config as ``python run.py <overrides>`` would see it, writing under tmp_path."""
    GlobalHydra.instance().clear()
    cfg = copy.deepcopy(composed(tuple(overrides), hydra=True))
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.log_dir = str(tmp_path / "logs")
        cfg.hydra.runtime.output_dir = str(tmp_path)
    HydraConfig().set_config(cfg)
    return cfg


def data_config(name: str, seed: int, **overrides) -> DictConfig:
    """The ``data`` section of ``python run.py data=<name> seed=<seed>`` (its defaults list, the
    bases in configs/_base, composed), with ``overrides`` merged in."""
    GlobalHydra.instance().clear()
    cfg = composed((f"data={name}", f"seed={seed}"), hydra=False)
    return OmegaConf.merge(cfg, {"data": overrides}).data


@pytest.fixture
def tiny_config(tmp_path: Path):
    """Compose a tiny CPU config of ``model`` (Chronos-T5 by default); extra overrides come
    after the tiny defaults."""

    def make(*overrides: str, model: str = "chronos") -> DictConfig:
        return compose_config(tmp_path, [*tiny_for(model), *overrides])

    return make
