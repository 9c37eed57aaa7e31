"""Sundial: parity with the official code on the same weights (the fixture of
tests/fixtures/sundial/make_fixture.py: a tiny random Sundial built and run by the published
remote code in a side environment), the loss against an independent computation, the sampled
forecast against the official ``generate``'s samples, and what a checkpoint directory must
hold.

Tolerance: float32 against float32 on the same weights and kernels. Every layer's output, the
attention outputs and the final norm 1e-6 (measured: 0.0, bit-identical; ``pytest -s`` prints
the differences), the loss 1e-6 relative (measured: 0.0, the same noise and time draws in the
same order after the same seed). The samples are the official ones draw for draw (isoprobe
draws the flow head's noise in the official order and shape): they differ only because the
official ``generate`` divides the context by its standard deviation plus 1e-5 and isoprobe by
the standard deviation alone (scale-equivariance), a relative 1e-5 / σ of the inputs;
allowed 1e-5 of the samples' largest magnitude (measured: 9.7e-5 of 42, 2.3e-6 of it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.sundial.config import parameter_count
from isoprobe.models.sundial.module import context_statistics
from isoprobe.models.sundial.network import time_features
from isoprobe.probing.capture import capture_outputs
from tests.models.published import built_model, copied_checkpoint, largest_difference

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sundial"
LAYERS, LOSS, SAMPLES = 1e-6, 1e-6, 1e-5
CONTEXT, HORIZON = 20, 10


def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "outputs.npz") as outputs:
        return dict(outputs)


def build(tmp_path, checkpoint: str, *overrides: str, context=CONTEXT, horizon=HORIZON):
    return built_model(tmp_path, "sundial", checkpoint, context, horizon, overrides)


def fixture_batch() -> dict[str, torch.Tensor]:
    """The fixture's series: its first 20 steps the context, the last 8 the target."""
    series = torch.from_numpy(official()["series"])
    return {
        "context": series[:, :CONTEXT],
        "target": series[:, CONTEXT:],
        "loc": torch.zeros(3),
        "scale": torch.ones(3),
    }


def test_every_layer_matches_the_official_code(tmp_path):
    """The patch embedding (of a context left-padded by 2 steps), every decoder layer and every
    attention output on one pass over the raw context, and the final norm (the head's first
    module) of the last layer's output."""
    model = build(tmp_path, str(FIXTURE))
    expected = official()
    layers = {**model.probe_layers("block"), **model.probe_layers("attention")}
    names = {"embed": "embed"}
    for i in range(len(model.network.layers)):
        names |= {f"decoder.{i}": f"layer.{i}", f"decoder.{i}.attn": f"attention.{i}"}
    context = torch.from_numpy(expected["context"])
    with torch.no_grad(), capture_outputs(layers) as captured:
        model._states(model._series(context))
    assert len(captured) == 1 + 2 * 3
    for name, output in captured.items():
        assert largest_difference(output[0], expected[names[name]], name) < LAYERS
    with torch.no_grad():
        final = model.network.head.norm(captured["decoder.2"][0])
    assert largest_difference(final, expected["final"], "final") < LAYERS


def test_the_loss_matches_the_official_training_loss(tmp_path):
    """The official ``forward`` with labels on the normalised series, the same seed: the
    same tokens, targets, noise and times."""
    model = build(tmp_path, str(FIXTURE))
    torch.manual_seed(7)
    with torch.no_grad():
        loss = float(model.loss(fixture_batch()))
    expected = float(official()["loss"])
    print(f"parity loss: {abs(loss - expected):.1e}")
    assert loss == pytest.approx(expected, rel=LOSS)


def test_samples_match_the_official_generate_draw_for_draw(tmp_path):
    """Ten steps from three calls of the flow head (4 + 4 + 2, each after the median of the
    last call's draws), 200 samples, the same seed; and the quantiles follow from them."""
    model = build(tmp_path, str(FIXTURE), "model.num_samples=200")
    torch.manual_seed(0)
    forecast = model.forecast(fixture_batch())
    expected = official()["samples"]
    tolerance = SAMPLES * np.abs(expected).max()
    assert largest_difference(forecast.samples, expected, "samples") < tolerance
    levels = np.array(model.quantile_levels)
    theirs = np.quantile(expected, levels, axis=1).transpose(1, 0, 2)
    assert largest_difference(forecast.quantiles, theirs, "quantiles") < tolerance


def test_the_loss_is_its_definition_with_gaps_and_padding(tmp_path):
    """Against the definition, with the draws taken as the loss takes them: a context that is
    not whole tokens (left padding), a gap in it, missing target steps and a target that is not
    whole tokens (right padding). Rows: every input token (all but the last of the series) and
    its next 4 steps, three copies outermost; per row ``Σ_j m_j (x̂_j - x_j)^2 / j`` over the
    observed steps, averaged over the rows holding one."""
    model = build(tmp_path, str(FIXTURE))
    rng = np.random.default_rng(3)
    context = rng.normal(4.0, 2.0, size=(2, 18)).astype(np.float32)
    target = rng.normal(4.0, 2.0, size=(2, 7)).astype(np.float32)
    context[1, 5:9] = np.nan
    target[0, 1:3] = np.nan
    batch = {"context": torch.from_numpy(context), "target": torch.from_numpy(target)}
    torch.manual_seed(11)
    with torch.no_grad():
        loss = float(model.loss(batch))

    means = np.array([np.nanmean(row) for row in context])
    deviations = np.array([np.nanstd(row) for row in context])
    series = np.concatenate(
        [np.full((2, 2), np.nan), context, target, np.full((2, 1), np.nan)], axis=1
    )
    series = (series - means[:, None]) / deviations[:, None]
    inputs = torch.from_numpy(series[:, :-4].astype(np.float32))
    with torch.no_grad():
        states = model._states(inputs)  # [2, 6, d]
    rows, goals = [], []
    for b in range(2):
        for i in range(states.shape[1]):
            window = series[b, 4 * (i + 1) : 4 * (i + 1) + 4]
            goals.append(np.pad(window, (0, 4 - len(window)), constant_values=np.nan))
            rows.append(states[b, i])
    goals = np.tile(np.stack(goals), (3, 1))
    states = torch.stack(rows).repeat(3, 1)
    torch.manual_seed(11)
    noise = torch.randn(goals.shape).double().numpy()
    t = torch.rand(len(goals)).double().numpy()
    clean = np.nan_to_num(goals)
    noisy = torch.from_numpy((t[:, None] * clean + (1 - t[:, None]) * noise).astype(np.float32))
    with torch.no_grad():
        predicted = model.network.head(states, noisy, torch.from_numpy(t).float()).double()
    terms = []
    for row in range(len(goals)):
        steps = np.flatnonzero(np.isfinite(goals[row]))
        if len(steps):
            error = (predicted[row].numpy()[steps] - goals[row][steps]) ** 2
            terms.append((error / (steps + 1)).sum())
    assert loss == pytest.approx(np.mean(terms), rel=1e-5)


def test_context_statistics_are_the_observed_values_mean_and_deviation():
    context = torch.tensor([[1.0, float("nan"), 3.0, 5.0], [2.0, 2.0, 2.0, float("nan")]])
    mean, deviation = context_statistics(context)
    torch.testing.assert_close(mean, torch.tensor([3.0, 2.0]))
    torch.testing.assert_close(deviation, torch.tensor([np.sqrt(8 / 3), 1.0]).float())


def test_time_features_are_the_sinusoid_of_a_thousand_times_t():
    t = torch.tensor([0.0, 0.25])
    features = time_features(t).double().numpy()
    frequencies = np.exp(-np.log(10000.0) * np.arange(128) / 128)
    angles = 1000 * np.array([0.0, 0.25])[:, None] * frequencies
    np.testing.assert_allclose(
        features, np.concatenate([np.cos(angles), np.sin(angles)], -1), atol=1e-4
    )


def test_forecasts_are_seeded_and_draw_every_path(tmp_path):
    model = build(tmp_path, str(FIXTURE), "model.num_samples=5")
    draws = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        draws.append(model.forecast(fixture_batch()).samples)
    assert draws[0].shape == (3, 5, HORIZON)
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert (draws[0].std(dim=1) > 0).all()


def test_the_parameter_count_is_the_networks(tmp_path):
    """The schema's estimate (which guards memory before building) counts every parameter."""
    model = build(tmp_path, str(FIXTURE))
    config = json.loads((FIXTURE / "config.json").read_text())
    assert parameter_count(config) == sum(p.numel() for p in model.network.parameters())


def test_an_export_reloads_the_same_weights_and_config(tmp_path):
    model = build(tmp_path, str(FIXTURE))
    model.export(str(tmp_path / "export"))
    exported = load_file(tmp_path / "export" / "model.safetensors")
    original = load_file(FIXTURE / "model.safetensors")
    assert set(exported) == set(original)
    assert all(torch.equal(exported[k], original[k]) for k in original)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    published = json.loads((FIXTURE / "config.json").read_text())
    keep = set(published) - {"initializer_range", "transformers_version", "use_cache"}
    assert {k: config[k] for k in keep} == {k: published[k] for k in keep}


def test_weights_that_do_not_fit_the_config_are_refused_in_one_message(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path, hidden_size=32)
    with pytest.raises(
        CheckpointError,
        match=r"do not fit the Sundial its config.json describes: embed_layer.output_layer.weight "
        r"has shape \(16, 24\) in the checkpoint but \(32, 24\) in the model",
    ):
        build(tmp_path, str(directory))


def test_weights_missing_a_tensor_are_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path)
    weights = load_file(directory / "model.safetensors")
    del weights["flow_loss.net.res_blocks.1.in_ln.bias"]
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 weights missing \(e.g. \['head.net.res_blocks.1"):
        build(tmp_path, str(directory))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_attention_heads": 3}, r"hidden_size=16 is not a multiple of num_attention_heads=3"),
        ({"hidden_act": "gelu"}, r"hidden_act='gelu' \(Sundial's is 'silu'\)"),
        ({"rope_theta": 500000}, r"rope_theta=500000 \(the official attention turns by base"),
        ({"num_hidden_layers": "3"}, r"num_hidden_layers is '3'; expected a whole number"),
        ({"output_token_lens": []}, r"output_token_lens is \[\]; expected a list"),
        ({"model_type": "time_moe"}, r"model_type is 'time_moe', not 'sundial'"),
        ({"patch_len": 4}, r"unexpected keys \['patch_len'\]"),
    ],
)
def test_a_config_isoprobe_cannot_build_is_refused_naming_the_field(tmp_path, change, named):
    directory = copied_checkpoint(FIXTURE, tmp_path, **change)
    with pytest.raises(CheckpointError, match=named):
        build(tmp_path, str(directory))


def test_another_models_checkpoint_is_refused_saying_what_sundial_loads(tmp_path):
    """The Toto parity fixture given to model=sundial: its keys named, and what loads."""
    other = Path(__file__).parents[1] / "fixtures" / "toto"
    with pytest.raises(
        CheckpointError, match=r"unexpected keys \[.*'embed_dim'.*model=sundial loads Sundial"
    ):
        build(tmp_path, str(other))


def test_the_forecast_follows_the_scale(tmp_path):
    """``c`` times a window forecasts ``c`` times its forecast (the same seed)."""
    model = build(tmp_path, str(FIXTURE), "model.num_samples=20")
    batch = fixture_batch()
    small = {**batch, "context": batch["context"] * 0.001}
    torch.manual_seed(3)
    forecast = model.forecast(batch).quantiles
    torch.manual_seed(3)
    scaled = model.forecast(small).quantiles * 1000
    torch.testing.assert_close(scaled, forecast, rtol=1e-4, atol=1e-4)
