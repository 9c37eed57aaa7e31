"""The probe's schedule in steps: every n-th optimizer step or log-spaced steps, rows labelled
with their step and the epochs completed."""

from __future__ import annotations

import pandas as pd
import pytest
from probe_toy import ToyData, ToyForecaster, toy_trainer

from isoprobe.probing import ProbeCallback
from isoprobe.probing.schedule import Schedule, log_spaced_steps
from isoprobe.tasks import run_task


def test_log_spaced_steps_run_from_step_zero_to_the_last_evenly_in_log_step():
    assert log_spaced_steps(5, 1000) == {0, 1, 10, 100, 1000}
    # rounding merges the early points of a short fit
    assert log_spaced_steps(6, 8) == {0, 1, 2, 3, 5, 8}
    assert log_spaced_steps(20, 3) == {0, 1, 2, 3}


def test_a_schedule_in_steps_does_not_probe_at_epoch_ends_and_two_are_refused():
    assert Schedule(every_n_epochs=2).after_epoch(2) and not Schedule(2).after_epoch(3)
    by_steps = Schedule(every_n_steps=3)
    assert not by_steps.after_epoch(1)
    assert [s for s in range(10) if by_steps.after_step(s, 9)] == [0, 3, 6, 9]
    with pytest.raises(ValueError, match="set one"):
        Schedule(every_n_steps=3, log_spaced_steps=4)
    with pytest.raises(ValueError, match="trainer.max_steps"):
        Schedule(log_spaced_steps=4).after_step(1, float("inf"))


def test_a_probe_every_n_steps_probes_mid_epoch_labelled_by_step_and_epoch(tmp_path):
    # ToyData: 4 training batches an epoch; every 3 steps over 2 epochs: steps 0, 3, 6
    probe = ProbeCallback(
        measures=["rank"],
        rank={"weights": False},
        output_dir=str(tmp_path),
        num_windows=4,
        every_n_steps=3,
    )
    toy_trainer([probe], max_epochs=2).fit(ToyForecaster(), datamodule=ToyData())
    assert probe.probed_steps == [0, 3, 6]
    rows = pd.read_csv(tmp_path / "rank_metrics.csv")
    assert rows.groupby("global_step").epoch.unique().map(list).to_dict() == {
        0: [0],
        3: [0],
        6: [1],
    }
    assert (tmp_path / "flow_of_ranks" / "step0.png").is_file()


@pytest.mark.slow
def test_the_acceptance_run_probes_at_steps_zero_four_and_eight(tiny_config, tmp_path):
    """``python run.py model=chronos_bolt data=energy trainer.max_steps=8`` with a probe every
    4 steps (``callbacks.probe.every_n_steps=4``), on a tiny run."""
    cfg = tiny_config(
        "model.checkpoint=scratch",
        "trainer.max_epochs=-1",
        "trainer.max_steps=8",
        "callbacks.probe.every_n_steps=4",
        model="chronos_bolt",
    )
    run_task(cfg)
    for file in ("probe_metrics.csv", "rank_metrics.csv"):
        rows = pd.read_csv(tmp_path / file)
        assert sorted(rows.global_step.unique()) == [0, 4, 8], file
        # 64 training windows in batches of 16: 4 steps an epoch
        assert rows.groupby("global_step").epoch.first().to_dict() == {0: 0, 4: 1, 8: 2}, file
