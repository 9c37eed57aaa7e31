"""The probes of a Trainer hold one SharedCollection; a probe that follows another takes its
probe set and schedule (one shared pass, the same epochs), and refuses a setting it would
ignore."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from probe_toy import ToyData, ToyForecaster, toy_trainer

from isoprobe.probing import IsotropyProbe, RankProbe

LEADER = dict(num_windows=8, batch_size=3, max_tokens=60, every_n_epochs=2, layers=["encoder.1"])


def _fit(callbacks: list, max_epochs: int = 2) -> ToyForecaster:
    model = ToyForecaster()
    toy_trainer(callbacks, max_epochs=max_epochs).fit(model, datamodule=ToyData())
    return model


def test_a_follower_takes_the_probe_set_and_schedule_and_shares_each_pass(tmp_path):
    iso = IsotropyProbe(output_dir=str(tmp_path), metrics={"k_max": 4}, **LEADER)
    rank = RankProbe(output_dir=str(tmp_path), follow="isotropy")
    model = _fit([iso, rank], max_epochs=3)

    assert rank.collection is iso.collection is not None
    for key, value in LEADER.items():
        assert getattr(rank, key) == value
    assert rank.probed_epochs == iso.probed_epochs == [0, 2]
    assert rank.window_indices == iso.window_indices
    assert {r["layer"] for r in rank.records if r["metric"] == "n_tokens"} == {"encoder.1"}
    # 8 windows in batches of 3: 3 forward passes per probe time, read by both probes
    assert len(model.probe_calls) == 2 * 3


def test_a_follower_alone_keeps_its_own_settings(tmp_path):
    rank = RankProbe(output_dir=str(tmp_path), follow="isotropy", num_windows=5, batch_size=5)
    model = _fit([rank], max_epochs=1)
    assert rank.num_windows == 5 and rank.every_n_epochs == 1
    assert rank.probed_epochs == [0, 1] and len(model.probe_calls) == 2


def test_a_setting_the_follower_would_ignore_is_refused(tmp_path):
    iso = IsotropyProbe(output_dir=str(tmp_path), metrics={"k_max": 4}, **LEADER)
    rank = RankProbe(output_dir=str(tmp_path), follow="isotropy", max_tokens=50)
    with pytest.raises(ValueError, match=r"follows probe 'isotropy'.*\{'max_tokens': 50\}"):
        _fit([iso, rank])


def test_the_default_callbacks_config_shares_the_isotropy_probe_set(tiny_config):
    cfg = tiny_config("callbacks.isotropy.num_windows=6", "callbacks.isotropy.every_n_epochs=3")
    iso, rank = instantiate(cfg.callbacks.isotropy), instantiate(cfg.callbacks.rank)
    model = _fit([iso, rank], max_epochs=1)
    assert rank.follow == "isotropy" and rank.collection is iso.collection
    assert (rank.num_windows, rank.every_n_epochs) == (6, 3)
    assert rank.max_tokens == iso.max_tokens == cfg.callbacks.isotropy.max_tokens
    assert rank.probed_epochs == iso.probed_epochs == [0]
    assert len(model.probe_calls) == 1  # one pass for both: 6 windows in one batch of 16
