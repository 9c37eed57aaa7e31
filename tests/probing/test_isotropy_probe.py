"""The isotropy measures on a toy forecaster: schedule, values, masking, failures, records,
config."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import CSVLogger
from probe_toy import (
    RecordingLogger,
    ToyData,
    ToyForecaster,
    ToyWindows,
    isotropy_probe,
    seeded_subsample,
    tokens_by_hand,
    toy_trainer,
)
from sklearn.decomposition import PCA

from isoprobe.metrics import ALL_METRICS, ProbeMetricsConfig, probe_metrics
from isoprobe.probing import ProbeCallback
from isoprobe.probing.collect import ProbePlan, gather_subsampled_tokens, run_probe_forward
from isoprobe.probing.plots import pca_coordinates
from isoprobe.probing.records import keep_foreign_file, make_record, read_records, write_records

LAYERS = ["embed", "encoder.0", "encoder.1"]
METRIC_KEYS = {"n_tokens", *(key for keys in ALL_METRICS.values() for key in keys)}
K_MAX = 4


def _trainer(tmp_path: Path, callbacks: list, max_epochs: int = 1, **kwargs) -> L.Trainer:
    return toy_trainer(callbacks, max_epochs=max_epochs, default_root_dir=str(tmp_path), **kwargs)


def _probe(tmp_path: Path, **kwargs) -> ProbeCallback:
    options = dict(num_windows=8, batch_size=3, max_tokens=60, metrics={"k_max": K_MAX})
    options.update(kwargs)
    return isotropy_probe(output_dir=str(tmp_path), **options)


def _read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(
        path, float_precision="round_trip", keep_default_na=False, na_values={"value": ["nan"]}
    )


def _value(df: pd.DataFrame, epoch: int, layer: str, metric: str) -> float:
    rows = df[(df["epoch"] == epoch) & (df["layer"] == layer) & (df["metric"] == metric)]
    assert len(rows) == 1
    return float(rows["value"].iloc[0])


def test_fit_probes_epoch_zero_and_every_n_epochs_with_all_layers_and_metrics(tmp_path):
    L.seed_everything(0)
    model = ToyForecaster()
    logger = CSVLogger(tmp_path / "logs")
    probe = _probe(tmp_path, every_n_epochs=2)
    _trainer(tmp_path, [probe], max_epochs=5, logger=logger, num_sanity_val_steps=2).fit(
        model, datamodule=ToyData()
    )

    df = _read_csv(tmp_path / "probe_metrics.csv")
    assert sorted(df["epoch"].unique()) == [0, 2, 4]
    assert list(df.columns[:6]) == ["probe", "epoch", "global_step", "layer", "metric", "value"]
    assert set(df.probe) == {"isotropy"}
    steps_per_epoch = 32 // 8
    assert dict(zip(df["epoch"], df["global_step"], strict=True)) == {
        e: e * steps_per_epoch for e in (0, 2, 4)
    }
    for _, rows in df.groupby("epoch"):
        assert set(rows["layer"]) == set(LAYERS)
        for layer in LAYERS:
            assert sorted(rows[rows["layer"] == layer]["metric"]) == sorted(METRIC_KEYS)
    assert probe.probed_epochs == [0, 2, 4]
    assert [r["value"] for r in probe.records] == df["value"].tolist()

    # sanity check (2 val batches) ran, but the probe's forward passes all came outside it
    assert len(model.probe_calls) == 3 * math.ceil(8 / 3)
    assert not any(model.probe_calls)

    # the logger got probe/<metric>/<layer> per probed epoch with probe/epoch
    logged = pd.read_csv(Path(logger.log_dir) / "metrics.csv", float_precision="round_trip")
    logged = logged.dropna(subset=["probe/epoch"])
    assert sorted(logged["probe/epoch"].astype(int)) == [0, 2, 4]
    for _, row in logged.iterrows():
        epoch = int(row["probe/epoch"])
        for layer in LAYERS:
            for metric in ("cos_inter", "isoscore", "eff_dim"):
                assert row[f"probe/{metric}/{layer}"] == _value(df, epoch, layer, metric)

    assert (tmp_path / "probe_trajectories.png").stat().st_size > 0
    for epoch in (0, 4):  # default PCA layers: first and last encoder layer
        for layer in ("encoder.0", "encoder.1"):
            assert (tmp_path / "pca" / f"{layer}_epoch{epoch}.png").stat().st_size > 0
    # pictures at the first and the last probe only (figures_every_n_epochs=0)
    assert not list((tmp_path / "pca").glob("*_epoch2.png"))
    assert not list((tmp_path / "pca").glob("embed_*"))


def test_values_equal_probe_metrics_on_tokens_gathered_by_hand(tmp_path):
    L.seed_everything(0)
    model = ToyForecaster()
    initial = copy.deepcopy(model)
    data = ToyData()
    probe = _probe(tmp_path, seed=5, window_selection="random", num_windows=7, max_tokens=40)
    _trainer(tmp_path, [probe], max_epochs=1).fit(model, datamodule=data)
    df = _read_csv(tmp_path / "probe_metrics.csv")

    windows = probe.window_indices
    assert len(windows) == 7 and windows == sorted(set(windows)) and windows != list(range(7))
    cfg = ProbeMetricsConfig(k_max=K_MAX, seed=5)
    for epoch, weights in ((0, initial), (1, model)):
        tokens = tokens_by_hand(weights, data.val_dataset, windows, batch_size=3)
        for layer in LAYERS:
            assert tokens[layer].shape[0] > 40  # the subsample is active
            X = seeded_subsample(tokens[layer], 40, seed=5)
            expected = probe_metrics(X, cfg)
            got = {m: _value(df, epoch, layer, m) for m in expected}
            assert got == pytest.approx(expected, rel=0, abs=0, nan_ok=True)
            assert _value(df, epoch, layer, "n_tokens") == 40


def test_only_masked_tokens_are_measured(tmp_path):
    L.seed_everything(0)
    model = ToyForecaster()
    data = ToyData()
    probe = _probe(tmp_path, max_tokens=10_000, pca_layers=[])
    _trainer(tmp_path, [probe]).validate(model, datamodule=data, verbose=False)
    df = _read_csv(tmp_path / "probe_metrics.csv")

    observed = int(ToyWindows(10, seed=2).observed[:8].sum())
    assert observed < 8 * 12  # some context values are missing in the probe windows
    for layer in LAYERS:  # the encoder's 13th (summary) token and missing values are excluded
        assert _value(df, 0, layer, "n_tokens") == observed
    tokens = tokens_by_hand(model, data.val_dataset, list(range(8)), batch_size=3)
    cfg = ProbeMetricsConfig(k_max=K_MAX, seed=0)
    for layer in LAYERS:
        assert tokens[layer].shape[0] == observed
        expected = probe_metrics(tokens[layer], cfg)
        assert {m: _value(df, 0, layer, m) for m in expected} == expected
    assert not (tmp_path / "pca").exists()


def test_collected_rows_are_the_masked_rows_in_probe_order(tmp_path):
    L.seed_everything(0)
    model = ToyForecaster()
    dataset = ToyWindows(10, seed=2)
    trainer = _trainer(tmp_path, [])
    windows = [9, 2, 4, 0, 7]
    plan = ProbePlan.build(len(windows), batch_size=2, world_size=1)
    local = run_probe_forward(trainer, model, dataset, windows, plan, model.probe_layers())
    tokens = gather_subsampled_tokens(trainer, plan, local, max_tokens=10_000, seed=0)
    assert model.training  # the previous mode is restored
    by_hand = tokens_by_hand(model, dataset, windows, batch_size=2)
    for layer in LAYERS:
        assert torch.equal(tokens[layer], by_hand[layer])


def test_probe_plan_deals_one_process_batches_round_robin():
    plan = ProbePlan.build(num_positions=8, batch_size=3, world_size=2)
    assert plan.batches[0] == ((0, 1, 2), (6, 7))
    assert plan.batches[1] == ((3, 4, 5), (0, 1, 2))
    assert plan.padding == ((False, False), (False, True))
    assert sorted(plan.positions(0) + plan.positions(1)) == list(range(8))
    many = ProbePlan.build(num_positions=2, batch_size=4, world_size=3)
    assert [len(b) for b in many.batches] == [1, 1, 1]
    assert many.positions(0) == [0, 1] and many.positions(1) == many.positions(2) == []


def test_unknown_layer_names_fail_with_the_available_ones(tmp_path):
    probe = _probe(tmp_path, layers=["embed", "encoder.7"])
    with pytest.raises(ValueError, match=r"encoder\.7.*'embed', 'encoder\.0', 'encoder\.1'"):
        _trainer(tmp_path, [probe]).fit(ToyForecaster(), datamodule=ToyData())
    probe = _probe(tmp_path, layers=["encoder.1"], pca_layers=["embed"])
    with pytest.raises(ValueError, match=r"pca_layers \['embed'\] are not probed"):
        _trainer(tmp_path, [probe]).fit(ToyForecaster(), datamodule=ToyData())


def test_a_layer_with_non_finite_states_is_recorded_as_error_and_others_go_on(tmp_path):
    L.seed_everything(0)
    model = ToyForecaster()

    def poison(_module, _args, output):
        output = output.clone()
        output[0, -2, 3] = math.inf  # the last context value of a batch's first window: real
        return output

    model.blocks[1].register_forward_hook(poison)
    probe = _probe(tmp_path, max_tokens=10_000)
    batches = math.ceil(8 / 3)
    with pytest.warns(UserWarning, match=rf"encoder\.1 at epoch 0 not measured: .*{batches} of"):
        _trainer(tmp_path, [probe]).validate(model, datamodule=ToyData(), verbose=False)
    df = _read_csv(tmp_path / "probe_metrics.csv")
    bad = df[df["layer"] == "encoder.1"]
    assert bad["metric"].tolist() == ["error"] and math.isnan(bad["value"].iloc[0])
    assert "NaN/inf" in bad["note"].iloc[0]
    for layer in ("embed", "encoder.0"):
        rows = df[df["layer"] == layer]
        assert set(rows["metric"]) == METRIC_KEYS
        assert rows[rows["metric"] != "silhouette"]["value"].map(math.isfinite).all()
    assert not (tmp_path / "pca" / "encoder.1_epoch0.png").exists()
    assert (tmp_path / "pca" / "encoder.0_epoch0.png").exists()


def test_validate_only_probes_once_and_never_the_same_epoch_twice(tmp_path):
    L.seed_everything(0)
    model = ToyForecaster()
    logger = RecordingLogger()
    probe = _probe(tmp_path)
    trainer = _trainer(tmp_path, [probe], logger=logger)
    trainer.validate(model, datamodule=ToyData(), verbose=False)
    trainer.validate(model, datamodule=ToyData(), verbose=False)
    assert probe.probed_epochs == [0]
    assert len(model.probe_calls) == math.ceil(8 / 3)
    probe_logs = [m for _, m in logger.calls if "probe/epoch" in m]
    assert [m["probe/epoch"] for m in probe_logs] == [0]
    assert probe_logs[0]["probe/n_tokens/embed"] == 60


def test_existing_csv_with_other_rows_is_moved_aside_not_overwritten(tmp_path):
    path = tmp_path / "probe_metrics.csv"
    ours = [make_record(0, 0, "embed", "cos_inter", 0.1), make_record(1, 4, "embed", "eff_dim", 2)]
    write_records(path, ours[:1])
    assert keep_foreign_file(path, ours) is None  # our own earlier rows: rewritten in place
    foreign = [
        make_record(0, 0, "embed", "cos_inter", 0.1),
        make_record(2, 8, "embed", "eff_dim", 3),
    ]
    write_records(path, foreign)
    aside = keep_foreign_file(path, ours)
    assert aside is not None and not path.exists()
    assert read_records(aside) == foreign
    write_records(path, ours)
    assert read_records(path) == ours


def test_hydra_config_builds_the_callback_and_takes_overrides(tiny_config):
    cfg = tiny_config("callbacks.probe.every_n_epochs=2", "callbacks.probe.layers=[embed]")
    probe = instantiate(cfg.callbacks.probe)
    assert isinstance(probe, ProbeCallback)
    assert list(probe.measure_sets) == ["isotropy", "rank", "cka", "readout"]
    assert probe.schedule.every_n_epochs == 2 and probe.probe_set.layers == ["embed"]
    metrics_config = probe.measure_sets["isotropy"].metrics_config
    assert metrics_config.k_max == cfg.callbacks.probe.isotropy.metrics.k_max
    assert metrics_config.seed == cfg.seed == probe.probe_set.seed


def test_pca_coordinates_are_the_principal_components():
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(300, 6, generator=gen) * torch.tensor([5.0, 3.0, 2.0, 0.5, 0.2, 0.1])
    X = X @ torch.linalg.qr(torch.randn(6, 6, generator=gen))[0] + 7.0
    reference = PCA(n_components=3).fit_transform(X.double().numpy())
    coords = pca_coordinates(X)
    np.testing.assert_allclose(np.abs(coords), np.abs(reference), atol=1e-9)
    flat = pca_coordinates(torch.randn(5, 2, generator=gen))
    assert flat.shape == (5, 3) and np.all(flat[:, 2] == 0)


def _probed_values(tmp_path: Path, model: ToyForecaster, trainer_precision: str, **probe) -> list:
    """Every (layer, metric, value) the isotropy probe records of ``model``'s weights in one
    validation-only run of a Trainer at ``trainer_precision``."""
    probe = _probe(tmp_path, pca_layers=[], **probe)
    trainer = _trainer(tmp_path, [probe], precision=trainer_precision)
    trainer.validate(model, datamodule=ToyData(), verbose=False)
    return [(r["layer"], r["metric"], r["value"]) for r in probe.records]


def test_the_probe_forwards_in_float32_whatever_the_trainer_precision(tmp_path):
    """By default the geometry of given weights is the float32 one: a bf16-mixed Trainer's
    probe records exactly a 32-true Trainer's; ``precision=trainer`` follows the trainer (under
    autocast): the same rows with other values."""
    L.seed_everything(0)
    model = ToyForecaster()
    float32 = _probed_values(tmp_path / "32", copy.deepcopy(model), "32-true")
    default = _probed_values(tmp_path / "bf16", copy.deepcopy(model), "bf16-mixed")
    following = _probed_values(
        tmp_path / "trainer", copy.deepcopy(model), "bf16-mixed", precision="trainer"
    )
    assert default == float32
    assert following != float32
    assert [row[:2] for row in following] == [row[:2] for row in float32]


def _collect(trainer, model, precision: str = "float32") -> dict[str, torch.Tensor]:
    plan = ProbePlan.build(4, batch_size=2, world_size=1)
    layers = model.probe_layers()
    return {
        name: tokens.rows
        for name, tokens in run_probe_forward(
            trainer, model, ToyWindows(4, seed=2), range(4), plan, layers, False, precision
        ).items()
    }


@pytest.mark.parametrize(
    "precision, dtype", [("float32", torch.float32), ("trainer", torch.bfloat16)]
)
def test_under_bf16_mixed_the_probed_rows_are_float32_unless_the_probe_follows_the_trainer(
    tmp_path, precision, dtype
):
    L.seed_everything(0)
    model = ToyForecaster()
    rows = _collect(_trainer(tmp_path, [], precision="bf16-mixed"), model, precision)
    assert rows["embed"].dtype == dtype  # a linear layer's output, under autocast or not


def test_weights_kept_in_bfloat16_are_probed_in_float32_and_left_as_they_were(tmp_path):
    """Weights a ``*-true`` precision keeps in bfloat16: the float32 probe computes with their
    values in float32 (the rows of a float32 model holding those values) and leaves them
    bfloat16, bit for bit."""
    L.seed_everything(0)
    model = ToyForecaster().bfloat16()
    held = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    float32 = copy.deepcopy(model).float()
    trainer = _trainer(tmp_path, [])
    rows, expected = _collect(trainer, model), _collect(trainer, float32)
    assert all(torch.equal(rows[layer], expected[layer]) for layer in LAYERS)
    assert all(rows[layer].dtype == torch.float32 for layer in LAYERS)
    state = model.state_dict()
    assert all(state[k].dtype == v.dtype and torch.equal(state[k], v) for k, v in held.items())


def test_an_unknown_probe_precision_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"precision must be one of \('float32', 'trainer'\)"):
        _probe(tmp_path, precision="bf16")


def test_the_probe_precision_is_a_setting_of_every_probe_config(tiny_config):
    default = tiny_config()
    assert instantiate(default.callbacks.probe).probe_set.precision == "float32"
    following = tiny_config("callbacks.probe.precision=trainer")
    assert instantiate(following.callbacks.probe).probe_set.precision == "trainer"
