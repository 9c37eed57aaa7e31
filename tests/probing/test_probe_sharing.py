"""One probe callback runs every measure set it names on ONE collection pass per probe time:
the same probe set, schedule and rows for all of them; a second probe callback is apart."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate
from probe_toy import ToyData, ToyForecaster, toy_trainer

from isoprobe.probing import ProbeCallback

PROBE_SET = dict(num_windows=8, batch_size=3, max_tokens=60, every_n_epochs=2, layers=["encoder.1"])


def _fit(callbacks: list, max_epochs: int = 2) -> ToyForecaster:
    model = ToyForecaster()
    toy_trainer(callbacks, max_epochs=max_epochs).fit(model, datamodule=ToyData())
    return model


def test_the_measure_sets_of_one_probe_share_its_probe_set_schedule_and_each_pass(tmp_path):
    probe = ProbeCallback(
        measures=["isotropy", "rank"],
        isotropy={"metrics": {"k_max": 4}},
        output_dir=str(tmp_path),
        **PROBE_SET,
    )
    model = _fit([probe], max_epochs=3)
    assert probe.probed_epochs == [0, 2] and probe.passes == 2
    for group in ("isotropy", "rank"):
        records = probe.records_of(group)
        assert {r["epoch"] for r in records} == {0, 2}
        assert {r["layer"] for r in records if r["metric"] == "n_tokens"} == {"encoder.1"}
        assert {r["probe"] for r in records} == {group}
    # 8 windows in batches of 3: 3 forward passes per probe time, read by both measure sets
    assert len(model.probe_calls) == 2 * 3


def test_an_unknown_or_repeated_measure_set_is_refused():
    with pytest.raises(ValueError, match=r"must name some of \['isotropy', 'rank'"):
        ProbeCallback(measures=["isotropy", "ranks"])
    with pytest.raises(ValueError, match="names a set twice"):
        ProbeCallback(measures=["rank", "rank"])


def test_the_default_callbacks_config_is_one_probe_of_every_measure_set(tiny_config):
    cfg = tiny_config("callbacks.probe.num_windows=6", "callbacks.probe.every_n_epochs=3")
    assert "isotropy" not in cfg.callbacks and "rank" not in cfg.callbacks
    probe = instantiate(cfg.callbacks.probe)
    model = _fit([probe], max_epochs=1)
    assert (probe.probe_set.num_windows, probe.schedule.every_n_epochs) == (6, 3)
    assert probe.probed_epochs == [0]
    assert {r["probe"] for r in probe.records} == {"isotropy", "rank"}
    assert len(model.probe_calls) == 1  # one pass for all: 6 windows in one batch of 16
