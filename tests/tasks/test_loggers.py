"""W&B goes online or offline as wandb's own settings and the configured key say."""

from __future__ import annotations

import lightning as L
import pandas as pd
import pytest
import wandb
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import WandbLogger
from omegaconf import OmegaConf, read_write

from isoprobe.tasks import sweep_analysis
from isoprobe.tasks.loggers import (
    AppendingCSVLogger,
    LoggersSavedWithCheckpoint,
    build_loggers,
    wandb_goes_offline,
)
from isoprobe.tasks.sweep_analysis import AnalyzeSweep
from tests.conftest import compose_config

SELF_HOSTED = "https://wandb.mylab.example"


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """A clean W&B environment: no key, no mode, a netrc of our own; wandb re-reads it."""
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    wandb.teardown()
    yield netrc
    wandb.teardown()


def login(netrc, host: str) -> None:
    """What ``wandb login --host`` leaves: a netrc entry with a 40-character key."""
    netrc.write_text(f"machine {host}\n  login user\n  password {'k' * 40}\n")
    netrc.chmod(0o600)


def test_a_key_for_a_self_hosted_server_logs_online(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", SELF_HOSTED)
    login(wandb_env, "wandb.mylab.example")
    assert not wandb_goes_offline()


def test_a_key_for_another_server_is_no_key(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", SELF_HOSTED)
    login(wandb_env, "wandb.elsewhere.example")
    assert wandb_goes_offline()


def test_api_key_in_the_environment_logs_online_and_wandb_mode_wins(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_BASE_URL", SELF_HOSTED)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert not wandb_goes_offline()
    monkeypatch.setenv("WANDB_MODE", "offline")
    wandb.teardown()
    assert wandb_goes_offline()


def test_build_loggers_sets_offline_only_without_a_key_and_fixes_a_wandb_run_id(
    wandb_env, monkeypatch, tmp_path
):
    cfg = OmegaConf.create(
        {
            "wandb": {
                "_target_": "lightning.pytorch.loggers.WandbLogger",
                "save_dir": str(tmp_path),
                "offline": False,
                "id": None,
                "project": "isoprobe-test",
            }
        }
    )
    monkeypatch.setenv("WANDB_BASE_URL", SELF_HOSTED)
    build_loggers(cfg, {})
    assert cfg.wandb.offline is True
    run_id = cfg.wandb.id
    assert len(run_id) == 8 and run_id.isalnum() and run_id == run_id.lower()

    cfg.wandb.offline, cfg.wandb.id = False, None
    login(wandb_env, "wandb.mylab.example")
    wandb.teardown()
    build_loggers(cfg, {"wandb": "resumed1"})
    assert cfg.wandb.offline is False
    assert cfg.wandb.id == "resumed1" and cfg.wandb.resume == "allow"


def test_without_a_key_or_a_mode_the_run_starts_offline(wandb_env, tmp_path):
    # what `python run.py` meets on a fresh machine: no WANDB_MODE, no key anywhere
    cfg = OmegaConf.create(
        {
            "wandb": {
                "_target_": "lightning.pytorch.loggers.WandbLogger",
                "save_dir": str(tmp_path),
                "offline": False,
                "project": "isoprobe-test",
            }
        }
    )
    logger = build_loggers(cfg, {})["wandb"]
    run = logger.experiment
    try:
        assert run.settings._offline
        assert list((tmp_path / "wandb").glob(f"offline-run-*-{cfg.wandb.id}"))
    finally:
        run.finish()


def test_csv_logger_continues_the_metrics_file_of_a_run_resumed_in_place(tmp_path):
    first = AppendingCSVLogger(str(tmp_path), name="csv", version="")
    first.log_metrics({"train/loss": 4.0}, step=1)
    first.save()
    again = AppendingCSVLogger(str(tmp_path), name="csv", version="")
    again.log_metrics({"train/loss": 3.0, "val/loss": 3.5}, step=2)  # a new column too
    again.save()
    rows = pd.read_csv(tmp_path / "csv" / "metrics.csv")
    assert rows.step.tolist() == [1, 2]
    assert rows["train/loss"].tolist() == [4.0, 3.0]
    assert rows["val/loss"].isna().tolist() == [True, False]


class _ProbeLikeLogger(Callback):
    """Logs at the end of each validation, before the checkpoint callback saves (as the probes
    do: their rows reach the loggers after Lightning has written the validation's)."""

    def on_validation_end(self, trainer, pl_module):
        for logger in trainer.loggers:
            logger.log_metrics(
                {"probe_x": 1.0, "epoch": trainer.current_epoch}, trainer.global_step
            )


@pytest.mark.parametrize("saved", [True, False])
def test_each_checkpoint_is_written_after_the_csv_rows_logged_before_it(tmp_path, saved):
    """When a checkpoint file is written, metrics.csv already holds the rows logged before it
    (the probe's of the epoch it ends), so a run killed right after it loses none of them.
    Without the callback they still sit in the CSV logger's buffer then."""
    logger = AppendingCSVLogger(tmp_path, name="csv", version=0)
    extra = [LoggersSavedWithCheckpoint()] if saved else []
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints", save_last=True)
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=2,
        logger=logger,
        callbacks=[_ProbeLikeLogger(), checkpoint, *extra],
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    on_disk_at_save: list[set[int]] = []
    write = trainer.strategy.save_checkpoint

    def save_checkpoint(checkpoint, filepath, storage_options=None):
        metrics = tmp_path / "csv" / "version_0" / "metrics.csv"
        table = pd.read_csv(metrics) if metrics.is_file() else pd.DataFrame()
        rows = table.dropna(subset=["probe_x"]) if "probe_x" in table else table
        on_disk_at_save.append(set(rows["epoch"].astype(int)) if len(rows) else set())
        write(checkpoint, filepath, storage_options)

    trainer.strategy.save_checkpoint = save_checkpoint
    trainer.fit(BoringModel())
    assert len(on_disk_at_save) >= 2
    if saved:
        assert on_disk_at_save[0] == {0} and on_disk_at_save[-1] == {0, 1}
    else:
        assert on_disk_at_save[0] == set()


@pytest.fixture
def offline(monkeypatch):
    """W&B offline; the Hydra config these tests set is unset after them."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    yield
    HydraConfig.instance().cfg = None


def as_multirun(cfg) -> None:
    """``cfg`` as a job of a multirun sees it."""
    with read_write(cfg.hydra):
        cfg.hydra.mode = RunMode.MULTIRUN


def wandb_logger_of(cfg) -> WandbLogger:
    """The W&B logger a run of ``cfg`` builds (the run's Hydra config set as Hydra sets it)."""
    HydraConfig().set_config(cfg)
    return build_loggers(cfg.logger, {})["wandb"]


@pytest.mark.parametrize("task", ["finetune", "probe"])
def test_a_sweeps_runs_are_one_wandb_group_named_after_the_sweep(tmp_path, offline, task):
    sweep = tmp_path / "multiruns" / "2026-11-28_09-30-00"
    cfg = compose_config(tmp_path, [f"task={task}", "logger=wandb", f"hydra.sweep.dir={sweep}"])
    as_multirun(cfg)
    init = wandb_logger_of(cfg)._wandb_init
    assert init["group"] == "2026-11-28_09-30-00" and init["job_type"] == task


def test_a_single_run_has_no_wandb_group_and_a_set_group_is_kept(tmp_path, offline):
    cfg = compose_config(tmp_path, ["task=finetune", "logger=wandb"])
    assert cfg.hydra.mode in (None, RunMode.RUN)
    assert wandb_logger_of(cfg)._wandb_init.get("group") is None
    cfg = compose_config(tmp_path, ["logger=wandb", "logger.wandb.group=mine"])
    as_multirun(cfg)
    assert wandb_logger_of(cfg)._wandb_init["group"] == "mine"


def test_a_sweeps_analysis_is_in_the_group_of_its_runs(tmp_path, offline, monkeypatch):
    sweep = tmp_path / "multiruns" / "2026-11-28_09-30-00"
    analysed = []
    monkeypatch.setattr(sweep_analysis, "run_analyze", analysed.append)
    for group in ([], ["logger.wandb.group=mine"]):
        cfg = compose_config(tmp_path, ["logger=wandb", *group, f"hydra.sweep.dir={sweep}"])
        as_multirun(cfg)
        runs_group = wandb_logger_of(cfg)._wandb_init["group"]
        AnalyzeSweep().on_multirun_end(config=cfg)
        assert analysed.pop().analyze.group == runs_group
