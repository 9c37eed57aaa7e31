"""Moirai 2.0: parity with the official code on the same weights (the fixture of
tests/fixtures/moirai2/make_fixture.py: a tiny random ``Moirai2Module`` built and run by
uni2ts 2.0.0 in a side environment), the loss against an independent numpy computation, the
packing, and what a checkpoint directory must hold.

Tolerance: float32 against float32 on the same weights, where only the order of summation
differs (the official fused ``scaled_dot_product_attention``, einsum): 1e-5 for every layer, the
head and the one-call forecast, 1e-4 for the rolled-out forecast (its second and third calls
read quantiles of the first call's outputs back) and the loss. Largest differences measured
(``pytest -s -k official`` prints them): ``in_proj`` 0, the blocks <= 4.8e-7, the attentions
<= 3.5e-7, the head 9.5e-7; the one-call forecast (8 steps) 4.8e-7; the roll-out (20 steps, three
calls) 9.5e-7, and so its sorted quantiles (its median 4.8e-7); the loss 0 (the same float32
value)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.moirai2.config import official_config, parameter_count, shape_from_fields
from isoprobe.models.moirai2.module import pack, standardisation
from isoprobe.models.moirai2.network import Moirai2Network
from isoprobe.probing.capture import capture_outputs
from tests.conftest import compose_config
from tests.models.published import built_model, copied_checkpoint, largest_difference

FIXTURE = Path(__file__).parents[1] / "fixtures" / "moirai2"
#: Salesforce/moirai-2.0-R-small's config.json (its comment names the sources) and the
#: parameters uni2ts 2.0.0's Moirai2Module has when built from it
PUBLISHED = FIXTURE / "published-config.yaml"
PUBLISHED_PARAMETERS = 11_387_208
LAYERS, ROLL_OUT = 1e-5, 1e-4


def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "outputs.npz") as outputs:
        return dict(outputs)


def build(tmp_path, checkpoint: str, context: int, horizon: int, *overrides: str):
    return built_model(tmp_path, "moirai2", checkpoint, context, horizon, overrides)


def fixture_model(tmp_path, horizon: int | None = None):
    expected = official()
    context = torch.from_numpy(expected["context"])
    target = torch.from_numpy(expected["target"])
    horizon = target.shape[1] if horizon is None else horizon
    model = build(tmp_path, str(FIXTURE), context.shape[1], horizon)
    batch = {
        "context": context,
        "target": target,
        "loc": torch.zeros(len(context)),
        "scale": torch.ones(len(context)),
    }
    return model, batch, expected


def test_every_layer_and_the_head_match_the_official_code(tmp_path):
    model, batch, expected = fixture_model(tmp_path)
    layers = {**model.probe_layers("block"), **model.probe_layers("attention")}
    layers["head"] = model.head_modules()[0]
    with torch.no_grad(), capture_outputs(layers) as captured:
        model.probe_forward(batch)
    assert len(layers) == 2 + 2 * model.shape.num_layers
    for name in layers:
        assert largest_difference(captured[name][0], expected[name], name) < LAYERS


def test_one_call_forecast_matches_the_official_forward(tmp_path):
    """8 steps: the last context patch's two predicted patches of 4."""
    model, batch, expected = fixture_model(tmp_path, 8)
    with torch.no_grad():
        quantiles = model._decode(batch["context"])
    assert largest_difference(quantiles, expected["forecast_short"], "forecast_short") < LAYERS


def test_the_roll_out_matches_the_official_forward(tmp_path):
    """20 steps from calls of two 4-step patches: the official roll-out (a path per level,
    the pooled 9 x 9 values' quantiles) in three calls; ``forecast``'s quantiles are the
    sorted levels, its median the 0.5 level."""
    model, batch, expected = fixture_model(tmp_path)
    with torch.no_grad():
        quantiles = model._decode(batch["context"])
    assert largest_difference(quantiles, expected["forecast"], "forecast") < ROLL_OUT
    forecast = model.forecast(batch)
    ordered = np.sort(expected["forecast"], axis=1)
    assert largest_difference(forecast.quantiles, ordered, "forecast quantiles") < ROLL_OUT
    assert largest_difference(forecast.median, ordered[:, 4], "forecast median") < ROLL_OUT


def test_the_loss_matches_the_official_quantile_loss(tmp_path):
    model, batch, expected = fixture_model(tmp_path)
    with torch.no_grad():
        loss = model.loss(batch)
    assert largest_difference(loss, expected["loss"], "loss") < ROLL_OUT


def test_the_caller_tensors_are_left_as_they_were(tmp_path):
    model, batch, _ = fixture_model(tmp_path)
    kept = {name: tensor.clone() for name, tensor in batch.items()}
    model.forecast(batch)
    model.loss(batch)
    for name, tensor in batch.items():
        assert torch.equal(tensor.isnan(), kept[name].isnan()), name
        assert torch.equal(tensor.nan_to_num(), kept[name].nan_to_num()), name


def test_the_fixture_weights_carry_the_official_names(tmp_path):
    model, _, _ = fixture_model(tmp_path)
    names = set(load_file(FIXTURE / "model.safetensors"))
    assert names == set(model.network.state_dict())
    assert {"encoder.layers.1.self_attn.var_attn_bias.emb.weight", "encoder.norm.weight"} <= names


def test_packing_marks_left_padding_gaps_and_time_indices():
    """Patches of 4: row 0 left-padded over 6 steps (a whole patch of padding, then a patch
    with 2 padded steps), row 1 with a whole patch missing inside."""
    nan = float("nan")
    series = torch.arange(16.0).repeat(2, 1)
    series[0, :6] = nan
    series[1, 4:8] = nan
    packed = pack(series, 4)
    assert packed.sample_id.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert packed.time_id.tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]
    assert packed.observed.any(-1).tolist() == [
        [False, True, True, True],
        [True, False, True, True],
    ]
    loc, scale = standardisation(packed)
    observed = series[0, 6:].double()
    assert loc[0].tolist() == pytest.approx([0.0] + [float(observed.mean())] * 3)
    expected_scale = float((observed.var(correction=1) + 1e-5).sqrt())
    assert scale[0].tolist() == pytest.approx([1.0] + [expected_scale] * 3)


def test_the_loss_is_uni2ts_quantile_loss_of_every_real_patch_ahead(tmp_path):
    """Against numpy on the head's own outputs: a whole padding patch and part of one, a gap,
    a missing target step; every non-padding patch predicts the 2 patches of 4 after it in
    the window's standardised units; per window the mean over its observed predicted steps,
    then the mean over the windows."""
    model, _, _ = fixture_model(tmp_path)
    rng = np.random.default_rng(4)
    context = rng.normal(5.0, 2.0, size=(2, 24)).astype(np.float32)
    target = rng.normal(5.0, 2.0, size=(2, 20)).astype(np.float32)
    context[0, :6] = np.nan
    context[1, 9:14] = np.nan
    target[1, 2:5] = np.nan
    batch = {"context": torch.from_numpy(context), "target": torch.from_numpy(target)}
    with torch.no_grad(), capture_outputs({"head": model.head_modules()[0]}) as captured:
        loss = float(model.loss(batch))
    out = captured["head"][0].double().numpy().reshape(2, 6, 2, 9, 4)
    levels = np.array(model.shape.quantile_levels)
    series = np.concatenate([context, target], axis=1).astype(np.float64)
    windows = []
    for row in range(2):
        seen = context[row][np.isfinite(context[row])].astype(np.float64)
        loc, scale = seen.mean(), np.sqrt(seen.var(ddof=1) + 1e-5)
        terms = []
        for i in range(6):
            if row == 0 and i == 0:  # a patch of left padding only predicts nothing
                continue
            for k in range(2):
                for j in range(4):
                    t = 4 * (i + 1 + k) + j
                    if t >= series.shape[1] or not np.isfinite(series[row, t]):
                        continue
                    y = (series[row, t] - loc) / scale
                    e = y - out[row, i, k, :, j]
                    terms.append(
                        np.where(e > 0, levels * np.abs(e), (1 - levels) * np.abs(e)).mean()
                    )
        windows.append(np.mean(terms))
    assert loss == pytest.approx(np.mean(windows), rel=1e-5)


def test_a_moirai_1_config_is_refused_naming_its_keys(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path, patch_sizes=[8, 16], distr_output={})
    with pytest.raises(
        CheckpointError, match=r"unexpected keys \['distr_output', 'patch_sizes'\].*model=moirai"
    ):
        build(tmp_path, str(directory), 24, 20)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"d_model": 96}, r"d_model=96 is not a multiple of 64"),
        ({"quantile_levels": [0.9, 0.1]}, r"quantile_levels=\[0.9, 0.1\] is not a rising list"),
        ({"num_layers": "2"}, r"num_layers is '2'; expected a whole number"),
        ({"dropout_p": 1.5}, r"dropout_p is 1.5"),
    ],
)
def test_a_shape_isoprobe_cannot_build_is_refused_naming_the_field(tmp_path, change, named):
    directory = copied_checkpoint(FIXTURE, tmp_path, **change)
    with pytest.raises(CheckpointError, match=named):
        build(tmp_path, str(directory), 24, 20)


def test_weights_that_do_not_fit_the_config_are_refused_in_one_message(tmp_path):
    """The fixture's weights under a config.json of two more blocks and another patch size:
    the first tensor that differs, with both shapes."""
    directory = copied_checkpoint(FIXTURE, tmp_path, patch_size=8, num_layers=4)
    with pytest.raises(
        CheckpointError,
        match=r"do not fit the Moirai 2.0 shape of its config.json: in_proj.hidden_layer.weight "
        r"has shape \(128, 8\) in the checkpoint but \(128, 16\)",
    ):
        build(tmp_path, str(directory), 24, 20)


def test_weights_missing_a_tensor_are_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path)
    weights = load_file(directory / "model.safetensors")
    del weights["encoder.layers.0.norm2.weight"]
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 weights missing \(e.g. \['encoder.layers.0.n"):
        build(tmp_path, str(directory), 24, 20)


def test_an_export_reloads_the_same_weights_and_config(tmp_path):
    """The fixture's float16 weights load as float32 and export back, as float16, bit for bit."""
    model, _, _ = fixture_model(tmp_path)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.export(str(tmp_path / "export"), dtype="float16")
    exported = load_file(tmp_path / "export" / "model.safetensors")
    original = load_file(FIXTURE / "model.safetensors")
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[k], original[k]) for k in original)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config == json.loads((FIXTURE / "config.json").read_text())


def test_the_published_config_builds_the_published_network(tmp_path):
    """The published config.json passes as it is, has uni2ts' parameter count (network and
    schema estimate), is what an export writes back, and ``model.sizes.small`` builds the same
    shape."""
    published = yaml.safe_load(PUBLISHED.read_text())
    shape = shape_from_fields(published, "moirai-2.0-R-small/config.json")
    assert (shape.num_heads, shape.outputs) == (6, 4 * 9 * 16)
    assert official_config(shape) == published
    with torch.device("meta"):
        network = Moirai2Network(shape)
    assert sum(p.numel() for p in network.parameters()) == PUBLISHED_PARAMETERS
    assert parameter_count(published) == PUBLISHED_PARAMETERS
    sizes = compose_config(tmp_path, ["model=moirai2"]).model.sizes
    assert shape_from_fields(OmegaConf.to_container(sizes.small), "sizes") == shape
