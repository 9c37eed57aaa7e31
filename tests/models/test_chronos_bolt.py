"""Chronos-Bolt wrapper against chronos-forecasting's own inference code and independent
computations: forecasts, loss, token masks, probe sites and official-format checkpoints."""

from __future__ import annotations

import importlib
import json
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from chronos.chronos_bolt import ChronosBoltModelForForecasting, ChronosBoltPipeline
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from transformers import T5Config

from isoprobe.models.checkpoints import CheckpointError, bundled_path
from isoprobe.models.chronos.bolt import ChronosBoltModule
from isoprobe.models.quantiles import (
    interpolation_matrix,
    is_evenly_spaced,
    quantiles_of_padded_heads,
)
from isoprobe.models.t5_attention import OnePositionSelfAttention

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/chronos_bolt.yaml")
LEVELS = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
#: the tiny official checkpoint: 16-step patches, a 64-step context, 8 steps at once, REG
BOLT = {
    "context_length": 64,
    "prediction_length": 8,
    "input_patch_size": 16,
    "input_patch_stride": 16,
    "quantiles": LEVELS,
    "use_reg_token": True,
}
CONTEXT, PATCH = 72, 16  # longer than the model's context: the window is truncated to 64
#: the quantile head's values (standardised scale) per level: ordered, as a trained model's
ORDERED = torch.linspace(-2, 2, len(LEVELS)).tolist()
#: crossing: q0.1 above q0.9, the 0.5 head not the median of the nine
CROSSED = [ORDERED[i] for i in (8, 0, 5, 2, 7, 4, 1, 6, 3)]


def official_checkpoint(directory: Path, head: list[float] | None = None) -> Path:
    """A tiny random ChronosBoltModelForForecasting saved with the official class. ``head``:
    its quantile head made to emit nearly these values per level at every step (the head's
    weights shrunk, its bias set to them); else the random head, whose quantiles cross."""
    config = T5Config(
        d_model=16,
        d_kv=4,
        num_heads=4,
        d_ff=32,
        num_layers=2,
        num_decoder_layers=2,
        feed_forward_proj="relu",
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        chronos_config=BOLT,
    )
    config.architectures = ["ChronosBoltModelForForecasting"]
    torch.manual_seed(0)
    model = ChronosBoltModelForForecasting(config)
    if head is not None:
        output = model.output_patch_embedding
        steps = BOLT["prediction_length"]
        with torch.no_grad():
            output.output_layer.weight.mul_(0.01)
            output.residual_layer.weight.mul_(0.01)
            output.residual_layer.bias.copy_(torch.tensor(head).repeat_interleave(steps))
    model.save_pretrained(directory)
    return directory


def make_module(checkpoint: str = "scratch", horizon: int = 8, **kwargs) -> ChronosBoltModule:
    torch.manual_seed(0)
    sizes = OmegaConf.to_container(CONFIG.sizes)
    sizes["mini"].update(
        d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, chronos_config=BOLT
    )
    module = ChronosBoltModule(
        checkpoint=checkpoint,
        sizes=sizes,
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=horizon,
        **kwargs,
    )
    return module.eval()


def make_batch(horizon: int = 8, batch_size: int = 4) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    context = torch.randn(batch_size, CONTEXT, generator=g).cumsum(-1) * 3 + 50
    context[0, :40] = float("nan")  # left padding: a short series
    context[1, 30:35] = float("nan")  # missing values inside
    target = torch.randn(batch_size, horizon, generator=g) * 3 + 50
    target[2, 1] = float("nan")
    return {
        "context": context,
        "target": target,
        "loc": torch.zeros(batch_size),
        "scale": torch.ones(batch_size),
    }


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return official_checkpoint(tmp_path / "official")


@pytest.mark.parametrize(
    "horizon, levels",
    [
        (8, LEVELS),  # the model's own levels and horizon
        (5, [0.05, 0.25, 0.5, 0.75, 0.95]),  # interpolated and extrapolated levels
        (8, [0.15, 0.33, 0.5, 0.71]),  # interpolated at other than midpoints
        (20, LEVELS),  # longer than the model's 8 steps: the pipeline's autoregressive loop
    ],
)
def test_forecasts_equal_the_official_pipeline(tmp_path, horizon, levels):
    """Bitwise, where the heads do not cross, with the quantiles sorted (the default)."""
    checkpoint = official_checkpoint(tmp_path / "official", head=ORDERED)
    module = make_module(str(checkpoint), horizon=horizon, quantile_levels=levels)
    assert module.sort_quantiles
    batch = make_batch(horizon)
    assert batch["context"].shape[1] > BOLT["context_length"]  # the pipeline keeps the last 64
    pipeline = ChronosBoltPipeline.from_pretrained(checkpoint)
    expected, median = pipeline.predict_quantiles(
        batch["context"], prediction_length=horizon, quantile_levels=levels
    )
    forecast = module.forecast(batch)
    assert forecast.quantiles.shape == (4, len(levels), horizon)
    assert torch.equal(forecast.quantiles, expected.permute(0, 2, 1))  # [B, H, Q]
    assert torch.equal(forecast.median, median)


@pytest.mark.parametrize(
    "horizon, levels",
    [
        (8, LEVELS),  # the model's own levels: the pipeline returns its heads as they are
        (8, [0.1, 0.5, 0.9]),
        (5, [0.05, 0.25, 0.5, 0.75, 0.95]),  # off the grid: the pipeline's torch.quantile rule
        (8, [0.15, 0.33, 0.5, 0.71]),
        (20, LEVELS),  # the autoregressive loop
        (20, [0.15, 0.5, 0.85]),
    ],
)
def test_unsorted_quantiles_equal_the_official_pipeline_bitwise_where_heads_cross(
    tmp_path, horizon, levels
):
    checkpoint = official_checkpoint(tmp_path / "official", head=CROSSED)
    module = make_module(
        str(checkpoint), horizon=horizon, quantile_levels=levels, sort_quantiles=False
    )
    batch = make_batch(horizon)
    pipeline = ChronosBoltPipeline.from_pretrained(checkpoint)
    raw = pipeline.predict(batch["context"], prediction_length=horizon)
    steps = BOLT["prediction_length"]  # later steps: empirical quantiles of the paths, ordered
    assert (raw[:, 0, :steps] > raw[:, -1, :steps]).all()  # q0.1 above q0.9 at every step
    expected, median = pipeline.predict_quantiles(
        batch["context"], prediction_length=horizon, quantile_levels=levels
    )
    forecast = module.forecast(batch)
    assert torch.equal(forecast.quantiles, expected.permute(0, 2, 1))
    assert torch.equal(forecast.median, median)
    sorted_forecast = make_module(str(checkpoint), horizon=horizon, quantile_levels=levels)
    quantiles = sorted_forecast.forecast(batch).quantiles
    assert (quantiles.diff(dim=1) >= 0).all()  # the default: quantiles that do not cross
    assert not torch.equal(quantiles, forecast.quantiles)


@pytest.mark.parametrize("horizon", [8, 20])
def test_crossing_quantiles_are_the_pipelines_sorted(checkpoint, horizon):
    """A random head's quantiles cross; the wrapper sorts them per step (the pipeline does not
    on its own levels), which also leaves the autoregressive paths' quantiles unchanged."""
    module, batch = make_module(str(checkpoint), horizon=horizon), make_batch(horizon)
    pipeline = ChronosBoltPipeline.from_pretrained(checkpoint)
    raw = pipeline.predict(batch["context"], prediction_length=horizon)
    assert (raw.diff(dim=1) < 0).any()  # the heads do cross
    expected = raw.sort(dim=1).values
    forecast = module.forecast(batch)
    assert (forecast.quantiles - expected).abs().max() < 1e-4
    assert torch.equal(forecast.median, forecast.quantiles[:, LEVELS.index(0.5)])


def test_an_official_checkpoint_loads_with_its_weights(checkpoint):
    module = make_module(str(checkpoint))
    assert module.resolved_checkpoint.kind == "path"
    official = ChronosBoltModelForForecasting.from_pretrained(checkpoint).eval()
    ours = module.model.state_dict()
    assert official.state_dict().keys() == ours.keys()
    assert all(torch.equal(v, ours[k]) for k, v in official.state_dict().items())
    context = make_batch()["context"]
    assert torch.equal(
        module.model(context=context).quantile_preds, official(context=context).quantile_preds
    )
    assert all(m.training for m in make_module(str(checkpoint)).train().modules())


def test_export_is_the_official_format(tmp_path):
    module, batch = make_module(), make_batch()
    module.export(str(tmp_path / "export"))
    config = json.loads((tmp_path / "export/config.json").read_text())
    assert config["architectures"] == ["ChronosBoltModelForForecasting"]
    assert config["chronos_pipeline_class"] == "ChronosBoltPipeline"
    pipeline = ChronosBoltPipeline.from_pretrained(tmp_path / "export")
    expected = pipeline.predict(batch["context"], prediction_length=8).sort(dim=1).values
    assert torch.allclose(module.forecast(batch).quantiles, expected, atol=1e-5)


def test_the_decoder_skips_what_one_position_needs_not(tmp_path, checkpoint):
    """One decoder position per forward: no cache is built (it would be thrown away) and the
    self-attention is the position's value (:class:`OnePositionSelfAttention`), while the
    exported config.json says what the official one says. The forecasts stay the official
    pipeline's bit for bit (the tests above)."""
    module, batch = make_module(str(checkpoint)), make_batch()
    attention = [type(block.layer[0].SelfAttention) for block in module.model.decoder.block]
    assert attention == [OnePositionSelfAttention] * len(module.model.decoder.block)
    caches = []
    module.model.decoder.register_forward_hook(
        lambda _module, _args, output: caches.append(output.past_key_values)
    )
    module.forecast(batch)
    module.loss(batch)
    assert caches == [None, None]
    module.export(str(tmp_path / "export"))
    official = json.loads((checkpoint / "config.json").read_text())
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    assert exported["use_cache"] == official["use_cache"] is True


def test_loss_equals_an_independent_quantile_loss():
    module = make_module(horizon=6)  # shorter than the model's 8 steps: the rest count zero
    batch = make_batch(horizon=6)
    context, target = batch["context"][:, -64:], batch["target"]
    loc = context.nanmean(dim=1, keepdim=True)
    scale = (context - loc).square().nanmean(dim=1, keepdim=True).sqrt()
    predicted = module.model(context=context).quantile_preds  # [B, Q, 8], the data's scale
    quantiles = (predicted[..., :6] - loc.unsqueeze(1)) / scale.unsqueeze(1)
    errors = ((target - loc) / scale).unsqueeze(1) - quantiles
    levels = torch.tensor(LEVELS).view(1, -1, 1)
    pinball = torch.maximum(levels * errors, (levels - 1) * errors).nan_to_num(0.0)
    expected = (2 * pinball).mean(dim=1).sum(dim=1).mean()
    torch.testing.assert_close(module.loss(batch), expected)


def test_a_target_longer_than_the_model_trains_its_horizon(caplog):
    with caplog.at_level("WARNING"):
        module = make_module(horizon=12)
    assert "the loss trains the first 8 steps" in caplog.text
    batch = make_batch(horizon=12)
    cut = {**batch, "target": batch["target"][:, :8]}
    assert torch.equal(module.loss(batch), module.loss(cut))


def test_token_masks_are_the_observed_patches_and_never_reg():
    module = make_module()
    context = torch.full((4, 40), 1.0)  # 40 steps: 8 steps of NaN padding make 3 patches
    context[:, ::3] = 2.0
    context[0, :24] = float("nan")  # patches 1 and 2 missing
    context[2, 8:24] = float("nan")  # patch 2 missing
    context[3] = float("nan")  # nothing observed
    batch = {"context": context, "target": torch.ones(4, 8)}
    layers = ["embed", "encoder.0", "encoder.1.attn", "decoder.1", "decoder.0.attn"]
    masks = module.token_masks(batch, layers)
    patches = torch.tensor([[0, 0, 1], [1, 1, 1], [1, 0, 1], [0, 0, 0]], dtype=torch.bool)
    reg = torch.zeros(4, 1, dtype=torch.bool)
    assert torch.equal(masks["embed"], torch.cat([patches, reg], dim=1))
    assert torch.equal(masks["encoder.0"], masks["embed"])
    assert torch.equal(masks["encoder.1.attn"], masks["encoder.0"])
    # the model's own attention mask is the same, with REG attended
    _, _, _, attention = module.model.encode(context)
    assert torch.equal(attention.bool(), torch.cat([patches, ~reg], dim=1))
    assert torch.equal(masks["decoder.1"], torch.tensor([[True], [True], [True], [False]]))
    assert torch.equal(masks["decoder.0.attn"], masks["decoder.1"])
    with pytest.raises(KeyError, match="unknown Chronos-Bolt layer"):
        module.token_masks(batch, ["output_patch_embedding"])


def test_probe_layers_capture_the_patch_embedding_and_every_block():
    module, batch = make_module(), make_batch()
    layers = module.probe_layers()
    assert list(layers) == ["embed", "encoder.0", "encoder.1", "decoder.0", "decoder.1"]
    captured = {}
    hooks = [
        m.register_forward_hook(lambda _m, _i, out, n=n: captured.setdefault(n, out))
        for n, m in layers.items()
    ]
    with torch.no_grad():
        module.probe_forward(batch)
    for h in hooks:
        h.remove()
    _, _, input_embeds, _ = module.model.encode(batch["context"])
    assert torch.equal(captured["embed"], input_embeds)  # the encoder's input, REG included
    assert captured["encoder.1"][0].shape == (4, 64 // PATCH + 1, 16)
    assert captured["decoder.0"][0].shape == (4, 1, 16)  # the one learned query


def test_attention_site_is_each_self_attention_output_before_the_residual_add():
    module, batch = make_module(), make_batch()
    attention = module.probe_layers("attention")
    assert list(attention) == [f"{s}.{i}.attn" for s in ("encoder", "decoder") for i in range(2)]
    captured: dict[str, torch.Tensor] = {}
    sublayer = module.model.decoder.block[1].layer[0]  # T5LayerSelfAttention: x + attn(norm(x))
    handles = [
        attention["decoder.1.attn"].register_forward_hook(
            lambda _m, _a, out: captured.update(attn=out[0])
        ),
        sublayer.register_forward_pre_hook(lambda _m, args: captured.update(x=args[0])),
        sublayer.register_forward_hook(lambda _m, _a, out: captured.update(out=out[0])),
    ]
    module.probe_forward(batch)
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(captured["out"], captured["x"] + captured["attn"])
    weights = module.attention_weights()["decoder.1"]
    assert weights["o"] is sublayer.SelfAttention.o.weight


def test_interpolation_is_numpy_interp_flat_beyond_the_grid():
    grid = [0.1, 0.3, 0.5, 0.6, 0.9]  # not equidistant
    values = np.sort(np.random.default_rng(0).normal(size=len(grid)))
    levels = [0.05, 0.1, 0.2, 0.5, 0.55, 0.75, 0.9, 0.99]
    weights = interpolation_matrix(levels, grid).double().numpy()
    np.testing.assert_allclose(weights @ values, np.interp(levels, grid, values), atol=1e-12)


def test_padded_heads_are_numpy_quantiles_of_the_heads_with_their_ends_repeated():
    rng = np.random.default_rng(0)
    heads = rng.normal(size=(2, 9, 3))  # crossing
    levels = [0.05, 0.1, 0.25, 0.5, 0.71, 0.97]
    padded = np.concatenate([heads[:, :1], heads, heads[:, -1:]], axis=1)
    expected = np.quantile(padded, levels, axis=1).transpose(1, 0, 2)
    ours = quantiles_of_padded_heads(torch.from_numpy(heads), levels).numpy()
    np.testing.assert_allclose(ours, expected, atol=1e-12)
    # on an evenly spaced grid and sorted heads: the interpolation between the grid's levels
    assert is_evenly_spaced(LEVELS) and not is_evenly_spaced([0.1, 0.5, 0.9])
    ordered = np.sort(heads, axis=1)
    interpolated = np.einsum("lg,bgh->blh", interpolation_matrix(levels, LEVELS).double(), ordered)
    ours = quantiles_of_padded_heads(torch.from_numpy(ordered), levels).numpy()
    np.testing.assert_allclose(ours, interpolated, atol=1e-12)


def test_unsorted_quantiles_on_an_uneven_grid_warn_of_the_pipelines_rule(caplog):
    uneven = {**BOLT, "quantiles": [0.1, 0.5, 0.9]}
    torch.manual_seed(0)
    sizes = OmegaConf.to_container(CONFIG.sizes)
    sizes["mini"].update(
        d_model=16, d_kv=4, d_ff=32, num_layers=2, num_decoder_layers=2, chronos_config=uneven
    )
    with caplog.at_level("WARNING"):
        ChronosBoltModule(
            checkpoint="scratch",
            sizes=sizes,
            optimizer=partial(torch.optim.AdamW, lr=1e-3),
            context_length=CONTEXT,
            prediction_length=8,
            quantile_levels=[0.25, 0.5],
            sort_quantiles=False,
        )
    assert "not evenly spaced" in caplog.text and "model.sort_quantiles=true" in caplog.text


def _rewrite_weights(directory: Path, change) -> None:
    tensors = load_file(directory / "model.safetensors")
    change(tensors)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def test_a_tensor_of_another_shape_is_named(checkpoint):
    def widen(tensors):
        tensors["output_patch_embedding.output_layer.bias"] = torch.zeros(5)

    _rewrite_weights(checkpoint, widen)
    with pytest.raises(
        CheckpointError, match=r"output_patch_embedding.output_layer.bias has shape \(5,\)"
    ):
        make_module(str(checkpoint))


def test_a_missing_patch_embedding_is_named_not_initialised_at_random(checkpoint):
    # transformers is told to stay silent about missing patch embeddings
    _rewrite_weights(checkpoint, lambda t: t.pop("input_patch_embedding.hidden_layer.weight"))
    with pytest.raises(CheckpointError, match="input_patch_embedding.hidden_layer.weight"):
        make_module(str(checkpoint))


def test_other_checkpoints_say_which_model_loads_them(tmp_path):
    with pytest.raises(CheckpointError, match="Chronos-T5 checkpoint.*model=chronos"):
        make_module(str(bundled_path("chronos-t5-mini")))
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="not a Chronos-Bolt checkpoint"):
        make_module(str(bert))


def test_a_truncated_weights_file_names_its_directory(checkpoint):
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"weights file in {checkpoint} .*truncated"):
        make_module(str(checkpoint))


def test_the_bundled_checkpoint_is_the_mini_size_in_training_mode():
    module = ChronosBoltModule(
        checkpoint="bundled",
        sizes=OmegaConf.to_container(CONFIG.sizes),
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=8,
    )
    mini = CONFIG.sizes.mini
    config = module.model.config
    assert (config.d_model, config.num_layers, config.d_ff) == (
        mini.d_model,
        mini.num_layers,
        mini.d_ff,
    )
    assert config.chronos_config == OmegaConf.to_container(mini.chronos_config)
    assert all(m.training for m in module.modules())
    provenance = bundled_path(CONFIG.bundled_name) / "provenance.json"
    assert "experiment=pretrain_chronos_bolt" in json.loads(provenance.read_text())["command"]


def test_without_chronos_bolt_the_error_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "chronos.chronos_bolt", None)
    monkeypatch.delitem(sys.modules, "isoprobe.models.chronos.bolt")
    with pytest.raises(ImportError, match="pip install 'chronos-forecasting"):
        importlib.import_module("isoprobe.models.chronos.bolt")


def test_memory_estimates_are_linear_in_the_batch_and_grow_with_the_horizon():
    module = make_module()
    weights = sum(p.numel() for p in module.parameters())
    assert module.training_memory_bytes(0) == 16 * weights
    step = module.training_memory_bytes(1) - module.training_memory_bytes(0)
    assert step > 0 and module.training_memory_bytes(8) == 16 * weights + 8 * step
    one = module.forecast_memory_bytes(1) - 4 * weights
    assert one > 0 and module.forecast_memory_bytes(5) == 4 * weights + 5 * one
    longer = make_module(horizon=20)  # 9 quantile paths per window beyond 8 steps
    assert longer.forecast_memory_bytes(1) - 4 * weights == 9 * one


@pytest.mark.parametrize(
    "horizon, length, sort_quantiles",
    [
        (48, 300, True),  # within the model's 64 steps
        (100, 300, True),  # beyond: the pipeline's autoregressive rule
        (48, 600, False),  # a context longer than the model's 512 steps: its heads cross once
        (100, 600, False),
    ],
)
def test_the_bundled_model_forecasts_as_the_official_pipeline(horizon, length, sort_quantiles):
    """Bitwise: sorted quantiles where the heads do not cross (300 steps), unsorted always."""
    bundled = bundled_path(CONFIG.bundled_name)
    pipeline = ChronosBoltPipeline.from_pretrained(bundled, dtype=torch.float32)
    module = ChronosBoltModule(
        checkpoint="bundled",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=length,
        prediction_length=horizon,
        sort_quantiles=sort_quantiles,
    ).eval()
    g = torch.Generator().manual_seed(0)
    steps = torch.arange(float(length))
    context = torch.stack(
        [
            torch.sin(steps / 7) * 5 + 20 + 0.3 * torch.randn(length, generator=g),
            steps / 10 + torch.randn(length, generator=g),
            torch.randn(length, generator=g).cumsum(0),
        ]
    )
    context[0, :100] = float("nan")
    raw = pipeline.predict(context, prediction_length=horizon)
    crossing = (raw.diff(dim=1) < 0).any()
    assert crossing == (length > 512)  # at 300 steps sorting changes nothing; at 600 it would
    expected, median = pipeline.predict_quantiles(context, prediction_length=horizon)
    forecast = module.forecast({"context": context})
    assert torch.equal(forecast.quantiles, expected.permute(0, 2, 1))
    assert torch.equal(forecast.median, median)
