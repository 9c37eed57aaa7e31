"""W&B goes online or offline as wandb's own settings and the configured key say."""

from __future__ import annotations

import pandas as pd
import pytest
import wandb
from omegaconf import OmegaConf

from isoprobe.tasks.loggers import AppendingCSVLogger, build_loggers, wandb_goes_offline

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
