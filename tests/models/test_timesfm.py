"""TimesFM wrapper: forecasts and loss against transformers' TimesFmModelForPrediction called
directly, official-format checkpoints, token masks on constructed windows, frequency categories."""

from __future__ import annotations

import importlib
import json
import sys
import types
from functools import partial

import pytest
import torch
from transformers import TimesFmConfig, TimesFmModelForPrediction

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.quantiles import interpolation_matrix
from isoprobe.models.timesfm import TimesFmModule, frequency_category

PATCH, MODEL_CONTEXT, STEP = 8, 32, 8
TINY = {
    "patch_length": PATCH,
    "context_length": MODEL_CONTEXT,
    "horizon_length": STEP,
    "num_hidden_layers": 2,
    "hidden_size": 16,
    "intermediate_size": 24,
    "head_dim": 4,
    "num_attention_heads": 4,
}
#: the largest |difference| between isoprobe's and the official forward's outputs, measured by
#: test_forecasts_equal_the_official_forward (float32, CPU): 0 for a 24-step window, 4.8e-7
#: for a 40-step one (truncated to the model's 32)
PARITY_TOLERANCE = 1e-5


def make_module(
    checkpoint: str = "scratch", context: int = 24, horizon: int = STEP, **kwargs
) -> TimesFmModule:
    torch.manual_seed(0)
    module = TimesFmModule(
        checkpoint=checkpoint,
        sizes={"tiny": TINY},
        size="tiny",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=context,
        prediction_length=horizon,
        freq=kwargs.pop("freq", "h"),
        **kwargs,
    )
    return module.eval()


def make_batch(context: int = 24, horizon: int = STEP, batch_size: int = 3) -> dict:
    g = torch.Generator().manual_seed(1)
    values = torch.randn(batch_size, context, generator=g).cumsum(-1) + 10
    values[0, :13] = float("nan")  # a short series: left padding
    values[1, :1] = float("nan")
    target = torch.randn(batch_size, horizon, generator=g) + 10
    return {
        "context": values,
        "target": target,
        "loc": torch.zeros(batch_size),
        "scale": torch.ones(batch_size),
    }


def official_call(model: TimesFmModelForPrediction, batch: dict, freq: int, **kwargs):
    """TimesFmModelForPrediction as its docs call it: a list of series of any length (the
    leading missing values dropped) and one frequency category per series."""
    series = [row[~row.isnan()] for row in batch["context"]]
    with torch.no_grad():
        return model(past_values=series, freq=[freq] * len(series), return_dict=True, **kwargs)


@pytest.mark.parametrize("context", [24, 40])  # shorter / longer than the model's 32 steps
def test_forecasts_equal_the_official_forward(context):
    module, batch = make_module(context=context), make_batch(context)
    official = official_call(module.model, batch, freq=0)
    with torch.no_grad():
        ours = module._predict(batch["context"])
    difference = (ours - official.full_predictions).abs().max().item()
    print(f"TimesFM parity, context {context}: max |difference| = {difference:.3g}")
    assert difference <= PARITY_TOLERANCE
    torch.testing.assert_close(ours[..., 0], official.mean_predictions, rtol=0, atol=1e-5)
    forecast = module.forecast(batch)  # the nine levels are TimesFM's own, sorted per step
    expected = official.full_predictions[..., 1:].sort(-1).values.transpose(1, 2)
    torch.testing.assert_close(forecast.quantiles, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(forecast.median, expected[:, 4], rtol=0, atol=1e-5)


def test_loss_equals_the_official_forwards_point_plus_quantile_loss():
    module, batch = make_module(), make_batch()
    official = official_call(module.model, batch, freq=0, future_values=batch["target"])
    with torch.no_grad():
        torch.testing.assert_close(module.loss(batch), official.loss)


def test_missing_targets_are_left_out_of_the_loss():
    module, batch = make_module(), make_batch()
    batch["target"][1, 3] = float("nan")
    with torch.no_grad():
        predictions = module._predict(batch["context"])
    keep = ~batch["target"].isnan()
    target, mean = batch["target"][keep], predictions[..., 0][keep]
    quantiles = predictions[..., 1:][keep]
    pinball = [
        torch.where(target >= quantiles[:, i], q * (target - quantiles[:, i]), 0).mean()
        + torch.where(target < quantiles[:, i], (1 - q) * (quantiles[:, i] - target), 0).mean()
        for i, q in enumerate(module.model.config.quantiles)
    ]
    expected = ((mean - target) ** 2).mean() + torch.stack(pinball).mean()
    with torch.no_grad():
        torch.testing.assert_close(module.loss(batch), expected)


def test_a_long_horizon_is_decoded_autoregressively_from_the_mean():
    module, batch = make_module(horizon=2 * STEP + 3), make_batch(horizon=2 * STEP + 3)
    with torch.no_grad():
        ours = module._predict(batch["context"])
        first = make_module()._predict(batch["context"])
        extended = torch.cat([batch["context"], first[..., 0]], dim=1)
        second = make_module(context=24 + STEP)._predict(extended)
    assert ours.shape == (3, 2 * STEP + 3, 10)
    torch.testing.assert_close(ours[:, :STEP], first)
    torch.testing.assert_close(ours[:, STEP : 2 * STEP], second, rtol=0, atol=1e-5)


def test_token_masks_are_the_patches_holding_an_observed_value():
    module = make_module(context=MODEL_CONTEXT)
    context = torch.arange(2 * MODEL_CONTEXT, dtype=torch.float32).view(2, MODEL_CONTEXT)
    context[0, :12] = float("nan")  # patch 0 all missing, patch 1 half
    context[1, 16:23] = float("nan")  # patch 2 keeps one value
    context[1, 24:32] = float("nan")  # patch 3 all missing inside the window
    batch = {"context": context}
    layers = [*module.probe_layers(), *module.probe_layers("attention")]
    masks = module.token_masks(batch, layers)
    expected = torch.tensor([[False, True, True, True], [True, True, True, False]])
    assert all(torch.equal(mask, expected) for mask in masks.values())
    short = module.token_masks({"context": context[:, -PATCH:]}, ["decoder.1"])["decoder.1"]
    assert torch.equal(short, torch.tensor([[False, False, False, True], [False] * 4]))
    with pytest.raises(KeyError, match="unknown TimesFM layer"):
        module.token_masks(batch, ["horizon_ff_layer"])


def test_probe_layers_are_the_input_block_each_layer_and_its_attention_output():
    module, batch = make_module(), make_batch()
    blocks, attention = module.probe_layers(), module.probe_layers("attention")
    assert list(blocks) == ["embed", "decoder.0", "decoder.1"]
    assert list(attention) == ["decoder.0.attn", "decoder.1.attn"]
    captured: dict[str, torch.Tensor] = {}
    layer = module.model.decoder.layers[1]
    handles = [
        blocks["embed"].register_forward_hook(lambda _m, _a, out: captured.update(embed=out)),
        layer.register_forward_pre_hook(lambda _m, args: captured.update(x=args[0])),
        attention["decoder.1.attn"].register_forward_hook(
            lambda _m, _a, out: captured.update(attn=out[0])
        ),
        layer.mlp.register_forward_pre_hook(lambda _m, args: captured.update(mlp_in=args[0])),
    ]
    with torch.no_grad():
        module.probe_forward(batch)
    for handle in handles:
        handle.remove()
    assert captured["embed"].shape == (3, MODEL_CONTEXT // PATCH, 16)
    # the attention site is what the layer adds to its input before the feed-forward
    torch.testing.assert_close(captured["mlp_in"], captured["x"] + captured["attn"])


def test_attention_weights_are_the_projection_parameters():
    module = make_module()
    weights = module.attention_weights()
    attn = module.model.decoder.layers[0].self_attn
    assert list(weights) == ["decoder.0", "decoder.1"]
    assert weights["decoder.0"]["q"] is attn.q_proj.weight
    assert weights["decoder.0"]["o"] is attn.o_proj.weight


def test_an_official_checkpoint_loads_and_forecasts_like_the_official_model(tmp_path):
    torch.manual_seed(5)
    official = TimesFmModelForPrediction(TimesFmConfig(**TINY)).eval()
    official.save_pretrained(tmp_path / "official")
    module, batch = make_module(checkpoint=str(tmp_path / "official")), make_batch()
    assert module.resolved_checkpoint.kind == "path"
    for name, value in official.state_dict().items():
        assert torch.equal(module.model.state_dict()[name], value), name
    expected = official_call(official, batch, freq=0).full_predictions
    with torch.no_grad():
        assert torch.equal(module._predict(batch["context"]), expected)
    module.export(str(tmp_path / "again"))
    reloaded = TimesFmModelForPrediction.from_pretrained(tmp_path / "again")
    assert torch.equal(official_call(reloaded, batch, freq=0).full_predictions, expected)


def test_a_checkpoint_that_does_not_fit_names_the_tensor(tmp_path):
    TimesFmModelForPrediction(TimesFmConfig(**TINY)).save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt/config.json").read_text())
    (tmp_path / "ckpt/config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    with pytest.raises(
        CheckpointError, match=r"decoder.input_ff_layer.input_layer.bias has shape \(24,\)"
    ):
        make_module(checkpoint=str(tmp_path / "ckpt"))
    (tmp_path / "ckpt/config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(CheckpointError, match="not a TimesFM 2.0 checkpoint"):
        make_module(checkpoint=str(tmp_path / "ckpt"))


@pytest.mark.parametrize(
    "freq, category",
    [
        ("30min", 0),
        ("min", 0),
        ("s", 0),
        ("h", 0),
        ("H", 0),
        ("6h", 0),
        ("D", 0),
        ("B", 0),
        ("W", 1),
        ("W-MON", 1),
        ("2W", 1),
        ("M", 1),
        ("ME", 1),
        ("MS", 1),
        ("SME", 1),
        ("Q", 2),
        ("QE-DEC", 2),
        ("QS", 2),
        ("Y", 2),
        ("YE", 2),
        ("YS", 2),
    ],
)
def test_pandas_aliases_map_to_timesfm_frequency_categories(freq, category):
    assert frequency_category(freq) == category


def test_unknown_frequencies_default_or_say_how_to_set_the_category(caplog):
    with caplog.at_level("WARNING"):
        assert frequency_category(None) == 0
    assert "frequency is unknown" in caplog.text
    with pytest.raises(ValueError, match="'synthetic' is not a pandas offset alias.*freq_category"):
        frequency_category("synthetic")
    with pytest.raises(ValueError, match="'synthetic'.*model.freq_category=0\\|1\\|2"):
        make_module(freq="synthetic")
    assert make_module(freq="synthetic", freq_category=2).freq_category == 2
    assert make_module(freq="W").freq_category == 1
    with pytest.raises(ValueError, match="freq_category=3 is not one of"):
        make_module(freq_category=3)


def test_the_frequency_category_reaches_the_model():
    module, batch = make_module(freq="QS"), make_batch()
    with torch.no_grad():
        ours = module._predict(batch["context"])
    assert torch.equal(ours, official_call(module.model, batch, freq=2).full_predictions)
    assert not torch.allclose(ours, official_call(module.model, batch, freq=0).full_predictions)


def test_other_quantile_levels_interpolate_timesfm_levels():
    grid = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    weights = interpolation_matrix((0.05, 0.25, 0.5, 0.975), grid)
    expected = torch.zeros(4, 9)
    expected[0, 0] = 1.0  # below the grid: its lowest level
    expected[1, 1], expected[1, 2] = 0.5, 0.5
    expected[2, 4] = 1.0
    expected[3, 8] = 1.0
    torch.testing.assert_close(weights, expected)
    module, batch = make_module(quantile_levels=(0.25, 0.5)), make_batch()
    forecast = module.forecast(batch)
    full = make_module().forecast(batch).quantiles
    torch.testing.assert_close(forecast.quantiles[:, 0], (full[:, 1] + full[:, 2]) / 2)
    torch.testing.assert_close(forecast.quantiles[:, 1], full[:, 4])


def test_memory_estimates_are_linear_in_the_batch():
    module = make_module()
    weights = 4 * sum(p.numel() for p in module.parameters())
    assert module.training_memory_bytes(0) == 4 * weights
    one = module.training_memory_bytes(1) - 4 * weights
    assert one > 0 and module.training_memory_bytes(4) - 4 * weights == 4 * one
    single = module.forecast_memory_bytes(1) - weights
    assert single > 0 and module.forecast_memory_bytes(3) - weights == 3 * single


def test_transformers_without_timesfm_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", types.ModuleType("transformers"))
    monkeypatch.delitem(sys.modules, "isoprobe.models.timesfm")
    with pytest.raises(ImportError, match=r"pip install -U 'transformers>=5,<6'"):
        importlib.import_module("isoprobe.models.timesfm")


def test_the_bundled_checkpoint_loads_in_float32_for_training():
    module = TimesFmModule(
        checkpoint="bundled",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=144,
        prediction_length=48,
        freq="30min",
    )
    assert module.resolved_checkpoint.kind == "bundled"
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert all(m.training for m in module.modules())
    assert module.model.config.context_length == 512 and module.freq_category == 0
