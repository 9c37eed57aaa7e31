"""TimesFM 2.5: parity with the official code on the same weights (the fixture of
tests/fixtures/timesfm25/make_fixture.py: a tiny random model built and run by the ``timesfm``
package 3.0.2 in a side environment), the loss against an independent numpy computation, the
running statistics, and what a checkpoint directory must hold.

Tolerance: float32 against float32 on the same weights, where only the order of summation
differs (the official fused attention kernel, its cached decoding): 1e-5 for every layer and
the heads of the one pass, 1e-4 for the decoded forecasts, whose two autoregressive passes
read the first pass's outputs back. Largest differences measured (``pytest -s -k official``
prints them): layers <= 1.9e-6; the point and quantile heads 2.9e-6 and 3.3e-6, the point head
mapped back by each patch's statistics 3.8e-6; the 20-step decoding 4.6e-5 (its quantile head
5.2e-6; its passes after the first run the appended patches alone through isoprobe's KV cache:
3.1e-5 recomputing every patch); the package's forecast 1.9e-5 (flip-invariant, clipped at 0)
and 1.8e-5 (with the continuous quantile head)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.timesfm25.module import flip_levels
from isoprobe.models.timesfm25.network import (
    denormalise,
    isoprobe_name,
    official_name,
    running_statistics,
)
from isoprobe.probing.capture import capture_outputs
from tests.models.published import built_model, copied_checkpoint, largest_difference

FIXTURE = Path(__file__).parents[1] / "fixtures" / "timesfm25"
LAYERS, HEADS, FORECAST = 1e-5, 1e-5, 1e-4
#: the fixture's shape as model.sizes overrides (what a published-layout directory builds)
TINY_PUBLISHED = [
    f"model.sizes.official_200m.{key}={value}"
    for key, value in json.loads((FIXTURE / "config.json").read_text()).items()
    if key not in ("model_type", "quantiles", "decode_index")
]


def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "outputs.npz") as outputs:
        return dict(outputs)


def build(tmp_path, checkpoint: str, context: int, horizon: int, *overrides: str):
    return built_model(tmp_path, "timesfm25", checkpoint, context, horizon, overrides)


def fixture_model(tmp_path, *overrides: str):
    expected = official()
    context = torch.from_numpy(expected["context"])
    horizon = expected["forecast"].shape[1]
    model = build(tmp_path, str(FIXTURE), context.shape[1], horizon, *overrides)
    batch = {
        "context": context,
        "target": torch.zeros(len(context), horizon),
        "loc": torch.zeros(len(context)),
        "scale": torch.ones(len(context)),
    }
    return model, batch, expected


def test_every_layer_matches_the_official_code(tmp_path):
    model, batch, expected = fixture_model(tmp_path)
    layers = {**model.probe_layers("block"), **model.probe_layers("attention")}
    with torch.no_grad(), capture_outputs(layers) as captured:
        model.probe_forward(batch)
    assert len(layers) == 1 + 2 * model.shape.num_layers
    for name in layers:
        assert largest_difference(captured[name][0], expected[name], name) < LAYERS


def test_both_heads_at_every_patch_match_the_official_code(tmp_path):
    """The declared head modules' outputs, and the point head mapped back by each patch's
    running statistics (the official ``decode``'s first pass)."""
    model, batch, expected = fixture_model(tmp_path)
    point, spread = model.head_modules()
    with torch.no_grad(), capture_outputs({"point": point, "spread": spread}) as captured:
        heads, _, mean, deviation = model._run(batch["context"])
    for name in ("point", "spread"):
        assert largest_difference(captured[name][0], expected[name], name) < HEADS
    mapped = denormalise(heads, mean[..., None, None], deviation[..., None, None])
    assert largest_difference(mapped, expected["decode_prefill"], "decode prefill") < HEADS


def test_decoding_past_one_output_patch_matches_official_decode(tmp_path):
    """20 steps from output patches of 8: one pass over the context, then two autoregressive
    passes that read the median channel back (row 0 left-padded by 7 steps)."""
    model, batch, expected = fixture_model(tmp_path)
    with torch.no_grad():
        forecast, spread = model._decode(batch["context"])
    first = expected["decode_prefill"][:, -1]
    steps = expected["decode_steps"].reshape(len(first), -1, first.shape[-1])
    decoded = np.concatenate([first, steps], axis=1)[:, : forecast.shape[1]]
    assert largest_difference(forecast, decoded, "decode") < FORECAST
    assert largest_difference(spread, expected["decode_spread"], "decode quantile head") < HEADS


@pytest.mark.parametrize(
    ("overrides", "name"),
    [((), "forecast"), (("model.use_continuous_quantile_head=true",), "forecast_continuous")],
)
def test_the_forecast_matches_the_official_forecast(tmp_path, overrides, name):
    """The package's ``forecast`` (flip invariance and the clip at 0 of positive rows 0 and
    1, its defaults), with and without the continuous quantile head; and ``forecast``'s
    quantiles are those channels, sorted (they do not cross here) at the same levels."""
    model, batch, expected = fixture_model(tmp_path, *overrides)
    with torch.no_grad():
        channels = model._predict(batch["context"])
    assert largest_difference(channels, expected[name], name) < FORECAST
    forecast = model.forecast(batch)
    quantiles = np.sort(expected[name][..., 1:], axis=-1).transpose(0, 2, 1)
    assert largest_difference(forecast.quantiles, quantiles, f"{name} quantiles") < FORECAST
    assert largest_difference(forecast.median, quantiles[:, 4], f"{name} median") < FORECAST


def test_the_fixture_weights_carry_the_official_names(tmp_path):
    model, _, _ = fixture_model(tmp_path)
    names = set(load_file(FIXTURE / "model.safetensors"))
    assert names == {official_name(name) for name in model.network.state_dict()}
    assert {"stacked_xf.1.attn.qkv_proj.weight", "stacked_xf.1.ff0.weight"} <= names
    assert isoprobe_name("stacked_xf.1.ff0.weight") == "stacked_xf.1.ff.ff0.weight"


def numpy_statistics(values: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """Each patch's mean and population std of every observed value up to its end (0, 0
    before the first), straight from the definition."""
    rows, patches = values.shape[0], values.shape[1] // patch
    mean, std = np.zeros((rows, patches)), np.zeros((rows, patches))
    for row in range(rows):
        for i in range(patches):
            seen = values[row, : (i + 1) * patch]
            seen = seen[np.isfinite(seen)]
            if len(seen):
                mean[row, i], std[row, i] = seen.mean(), seen.std()
    return mean, std


def test_running_statistics_are_the_observed_values_up_to_each_patch():
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 2.0, size=(2, 12))
    values[0, :5] = np.nan
    values[1, 6:9] = np.nan
    tensor = torch.from_numpy(values)
    missing = tensor.isnan().view(2, 4, 3)
    mean, std = running_statistics(tensor.nan_to_num(0.0).view(2, 4, 3), missing)
    expected_mean, expected_std = numpy_statistics(values, 3)
    np.testing.assert_allclose(mean.numpy(), expected_mean, atol=1e-12)
    np.testing.assert_allclose(std.numpy(), expected_std, atol=1e-12)


def test_the_loss_is_squared_error_plus_pinball_of_both_heads_at_every_real_patch(tmp_path):
    """Against numpy on the heads' own outputs: left padding (a whole patch and part of one),
    a gap in the context, missing target steps; patches predict the steps after them in their
    own normalised units, the point head 8 steps, the quantile head 32."""
    model, _, _ = fixture_model(tmp_path)
    rng = np.random.default_rng(4)
    context = rng.normal(5.0, 2.0, size=(2, 24)).astype(np.float32)
    target = rng.normal(5.0, 2.0, size=(2, 20)).astype(np.float32)
    context[0, :6] = np.nan
    context[1, 9:14] = np.nan
    target[1, 2:5] = np.nan
    batch = {"context": torch.from_numpy(context), "target": torch.from_numpy(target)}
    heads = dict(zip(("point", "spread"), model.head_modules(), strict=True))
    with torch.no_grad(), capture_outputs(heads) as captured:
        loss = float(model.loss(batch))
    series = np.concatenate([context, target], axis=1).astype(np.float64)
    mean, std = numpy_statistics(series[:, :24], 4)
    levels = np.array(model.shape.quantiles)
    total = 0.0
    for name, steps in (("point", 8), ("spread", 32)):
        out = captured[name][0].double().numpy().reshape(2, 6, steps, 10)
        terms, count = 0.0, 0
        for row in range(2):
            for i in range(6):
                if not np.isfinite(context[row, 4 * i : 4 * i + 4]).any():
                    continue
                for j in range(steps):
                    t = 4 * (i + 1) + j
                    if t >= series.shape[1] or not np.isfinite(series[row, t]):
                        continue
                    scale = std[row, i] if std[row, i] >= 1e-6 else 1.0
                    y = (series[row, t] - mean[row, i]) / scale
                    e = y - out[row, i, j, 1:]
                    pinball = np.maximum(levels * e, (levels - 1) * e).mean()
                    terms += (out[row, i, j, 0] - y) ** 2 + pinball
                    count += 1
        total += terms / count
    assert loss == pytest.approx(total, rel=1e-5)


def test_flipping_keeps_the_mean_and_reverses_the_levels():
    x = torch.arange(4.0).view(1, 4)
    assert flip_levels(x).tolist() == [[0.0, 3.0, 2.0, 1.0]]


def test_a_patch_without_an_observed_value_is_no_token_and_hidden_from_attention(tmp_path):
    """Row 2 with its third patch missing entirely (row 0 left-padded over its first): that
    token is not real, and pushing its embedding moves no other token's first-block output."""
    model, batch, _ = fixture_model(tmp_path)
    context = batch["context"].clone()
    context[2, 8:12] = float("nan")
    gapped = {**batch, "context": context}
    masks = model.token_masks(gapped, ["embed", "decoder.1"])
    assert masks["decoder.1"][2].tolist() == [True, True, False, True, True, True]
    assert masks["embed"][0].tolist() == [False, True, True, True, True, True]
    block = {"decoder.0": model.probe_layers()["decoder.0"]}
    outputs = []
    for bump in (0.0, 5.0):

        def push(_m, _a, out, bump=bump):
            out = out.clone()
            out[2, 2] += bump
            return out

        handle = model.network.tokenizer.register_forward_hook(push)
        with torch.no_grad(), capture_outputs(block) as captured:
            model.probe_forward(gapped)
        handle.remove()
        outputs.append(captured["decoder.0"][0][2])
    changed = (outputs[0] != outputs[1]).any(dim=-1)
    assert changed.tolist() == [False, False, True, False, False, False]


def test_a_config_json_without_an_architecture_builds_the_published_shape(tmp_path):
    """The published layout: config.json names no architecture, model.sizes.official_200m
    gives it (here the fixture's tiny shape), and the weights load into it."""
    directory = copied_checkpoint(FIXTURE, tmp_path)
    (directory / "config.json").write_text("{}")
    model = build(tmp_path, str(directory), 24, 20, *TINY_PUBLISHED)
    weights = load_file(FIXTURE / "model.safetensors")
    loaded = model.network.state_dict()
    assert all(torch.equal(loaded[isoprobe_name(k)], v) for k, v in weights.items())


def test_published_weights_that_do_not_fit_the_published_shape_are_refused(tmp_path):
    """The tiny weights under the real published shape: one message naming the first tensor
    that differs and both its shapes."""
    directory = copied_checkpoint(FIXTURE, tmp_path)
    (directory / "config.json").write_text("{}")
    with pytest.raises(
        CheckpointError,
        match=r"do not fit the TimesFM 2.5 shape of model.sizes.official_200m .*: "
        r"tokenizer.hidden_layer.weight has shape \(16, 8\) in the checkpoint but \(1280, 64\)",
    ):
        build(tmp_path, str(directory), 24, 20)


def test_another_architectures_config_is_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path)
    (directory / "config.json").write_text(json.dumps({"model_type": "timesfm"}))
    with pytest.raises(CheckpointError, match=r"not a TimesFM 2.5 config \(model_type='timesfm'"):
        build(tmp_path, str(directory), 24, 20)


def test_a_config_with_an_unknown_key_is_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path, num_experts=4)
    with pytest.raises(CheckpointError, match=r"unexpected keys \['num_experts'\]"):
        build(tmp_path, str(directory), 24, 20)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_heads": 3}, r"model_dims=16 is not a multiple of num_heads=3"),
        ({"quantiles": [0.9, 0.1]}, r"quantiles=\[0.9, 0.1\] is not a rising list"),
        ({"output_patch_len": 6}, r"output_patch_len=6 is not a multiple of input_patch_len=4"),
        ({"num_layers": "2"}, r"num_layers is '2'; expected a whole number"),
    ],
)
def test_a_shape_isoprobe_cannot_build_is_refused_naming_the_field(tmp_path, change, named):
    directory = copied_checkpoint(FIXTURE, tmp_path, **change)
    with pytest.raises(CheckpointError, match=named):
        build(tmp_path, str(directory), 24, 20)


def test_weights_missing_a_tensor_are_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path)
    weights = load_file(directory / "model.safetensors")
    del weights["stacked_xf.0.post_ff_ln.scale"]
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 weights missing \(e.g. \['stacked_xf.0.post"):
        build(tmp_path, str(directory), 24, 20)


def test_a_horizon_past_the_continuous_quantile_head_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"reaches 32 steps, fewer than .*prediction_length=40"):
        build(tmp_path, str(FIXTURE), 24, 40, "model.use_continuous_quantile_head=true")


def test_an_export_reloads_the_same_weights_and_config(tmp_path):
    model, _, _ = fixture_model(tmp_path)
    model.export(str(tmp_path / "export"))
    exported = load_file(tmp_path / "export" / "model.safetensors")
    original = load_file(FIXTURE / "model.safetensors")
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[k], original[k]) for k in original)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config == json.loads((FIXTURE / "config.json").read_text())
