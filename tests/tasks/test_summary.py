"""The table a run ends with, on constructed records."""

from __future__ import annotations

from isoprobe.tasks.summary import format_summary


def record(epoch: int, layer: str, metric: str, value: float, step: int | None = None) -> dict:
    step = 10 * epoch if step is None else step
    return {"epoch": epoch, "global_step": step, "layer": layer, "metric": metric, "value": value}


def test_first_and_last_epoch_per_layer_in_depth_order_and_both_forecasts():
    records = [
        record(e, layer, "isoscore", v)
        for e, layer, v in [(0, "encoder.1", 0.5), (2, "encoder.1", 0.25), (0, "embed", 0.75)]
    ]
    records.append(record(1, "embed", "isoscore", 0.125))
    text = format_summary(records, {"test/nmse": 0.5}, {"test/nmse": 0.25, "test/mase": 2.0})
    lines = text.splitlines()
    assert lines[0] == "probe metrics per layer, epoch 0 -> epoch 2:"
    assert lines[1].split() == ["layer", "isoscore"]
    assert lines[2].split() == ["embed", "0.75", "->", "0.125"]
    assert lines[3].split() == ["encoder.1", "0.5", "->", "0.25"]
    assert lines[5].split() == ["forecast", "(test)", "before", "after"]
    assert lines[6].split() == ["nmse", "0.5", "0.25"]
    assert lines[7].split() == ["mase", "nan", "2"]


def test_a_single_probe_shows_one_value_and_only_the_forecast_measured():
    text = format_summary([record(0, "embed", "eff_dim", 38.0)], {"test/wql": 0.17}, None)
    lines = text.splitlines()
    assert lines[0] == "probe metrics per layer, epoch 0:"
    assert lines[2].split() == ["embed", "38"]
    assert lines[4].split() == ["forecast", "(test)", "before"]
    assert lines[-1].split() == ["wql", "0.17"]


def test_a_schedule_in_steps_shows_its_first_and_last_probe_by_step():
    """Steps 0 and 4 share epoch 0: the first value is step 0's, not the later one's."""
    probes = [(0, 0, 0.75), (0, 4, 0.5), (1, 8, 0.25)]
    records = [record(e, "embed", "isoscore", v, step=s) for e, s, v in probes]
    lines = format_summary(records, None, None).splitlines()
    assert lines[0] == "probe metrics per layer, step 0 -> step 8:"
    assert lines[2].split() == ["embed", "0.75", "->", "0.25"]
