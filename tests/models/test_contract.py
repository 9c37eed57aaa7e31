"""The model contract (isoprobe.models.base.ForecastModule), checked for every configs/model/*.yaml
built from scratch: layers and sites, token masks, hooks, a probe that changes nothing,
forecasts of the right shape and scale, and export/reload."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from isoprobe.callbacks.collect import _capture_outputs
from torch import nn

from isoprobe.models.base import ATTENTION_PROJECTIONS, PROBE_SITES, ForecastModule
from isoprobe.tasks.runner import build_model
from tests.conftest import CONFIG_DIR, compose_config

MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
CONTEXT, HORIZON, BATCH = 32, 8, 3


def build(tmp_path, name: str, checkpoint: str = "scratch") -> ForecastModule:
    cfg = compose_config(tmp_path, [f"model={name}", f"model.checkpoint={checkpoint}"])
    windows = SimpleNamespace(
        context_length=CONTEXT, prediction_length=HORIZON, season_length=1, freq="h"
    )
    torch.manual_seed(0)
    return build_model(cfg.model, windows).eval()


def make_batch(scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    context = (torch.randn(BATCH, CONTEXT, generator=g).cumsum(-1) + 20) * scale
    context[0, :20] = float("nan")  # left padding: a short series, whole patches missing
    target = (torch.randn(BATCH, HORIZON, generator=g) + 20) * scale
    return {
        "context": context,
        "target": target,
        "loc": torch.zeros(BATCH),
        "scale": torch.ones(BATCH),
    }


def seeded_forecast(model: ForecastModule, batch: dict[str, torch.Tensor]):
    torch.manual_seed(11)
    return model.forecast(batch)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("site", PROBE_SITES)
def test_layers_masks_and_hooks(tmp_path, name, site):
    model = build(tmp_path, name)
    layers = model.probe_layers(site)
    assert layers and len(set(layers)) == len(layers)
    own = {id(m) for m in model.modules()}
    assert all(isinstance(m, nn.Module) and id(m) in own for m in layers.values())
    assert all(n.endswith(".attn") for n in layers) == (site == "attention")

    batch = make_batch()
    with torch.no_grad(), _capture_outputs(layers) as captured:
        model.probe_forward(batch)
    masks = model.token_masks(batch, list(layers))
    assert set(masks) == set(layers)
    for layer, outputs in captured.items():
        assert len(outputs) == 1, layer  # each probed module runs once per probe pass
        hidden, mask = outputs[0], masks[layer]
        assert hidden.dim() >= 3 and mask.dtype == torch.bool, layer
        assert tuple(mask.shape) == tuple(hidden.shape[:-1]), layer
        assert int(mask.sum()) > 0, layer
        if layer == "embed" or layer.startswith("encoder."):
            # layers that read the context: the missing values are no real tokens
            assert int(mask.sum()) < mask.numel(), layer
    assert all(not m._forward_hooks for m in model.modules())  # the hooks are gone


@pytest.mark.parametrize("name", MODELS)
def test_a_layer_no_site_has_is_refused_by_name(tmp_path, name):
    model = build(tmp_path, name)
    real = next(iter(model.probe_layers()))
    for wrong in ("encoder.99", "decoder.99.attn", "lm_head"):
        with pytest.raises(KeyError, match=rf"unknown .* layer '{wrong}'; known: .*'{real}'"):
            model.token_masks(make_batch(), [real, wrong])


@pytest.mark.parametrize("name", MODELS)
def test_probing_changes_no_weight_and_no_random_state(tmp_path, name):
    model = build(tmp_path, name)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    with torch.no_grad(), _capture_outputs(model.probe_layers()):
        model.probe_forward(make_batch())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", MODELS)
def test_forecasts_have_the_shape_and_follow_the_scale_of_the_context(tmp_path, name):
    model = build(tmp_path, name)
    forecast = seeded_forecast(model, make_batch())
    levels = len(model.quantile_levels)
    assert tuple(forecast.quantiles.shape) == (BATCH, levels, HORIZON)
    assert tuple(forecast.median.shape) == (BATCH, HORIZON)
    assert torch.isfinite(forecast.quantiles).all()
    assert (forecast.quantiles.diff(dim=1) >= 0).all()  # quantiles ordered by level
    scaled = seeded_forecast(model, make_batch(scale=100.0))
    torch.testing.assert_close(scaled.median, 100.0 * forecast.median, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", MODELS)
def test_export_and_reload_give_identical_forecasts(tmp_path, name):
    model = build(tmp_path, name)
    model.export(str(tmp_path / "export"))
    reloaded = build(tmp_path, name, checkpoint=str(tmp_path / "export"))
    batch = make_batch()
    first, again = seeded_forecast(model, batch), seeded_forecast(reloaded, batch)
    assert torch.equal(first.quantiles, again.quantiles)
    assert torch.equal(first.median, again.median)


@pytest.mark.parametrize("name", MODELS)
def test_attention_weights_are_the_parameters_the_blocks_apply(tmp_path, name):
    model = build(tmp_path, name)
    weights = model.attention_weights()
    blocks = [n for n in model.probe_layers("block") if n != "embed"]
    assert list(weights) == blocks
    parameters = {id(p) for p in model.parameters()}
    for block, parts in weights.items():
        assert tuple(parts) == ATTENTION_PROJECTIONS, block
        q, k, v, o = (parts[p] for p in ATTENTION_PROJECTIONS)
        assert q.dim() == k.dim() == v.dim() == o.dim() == 2, block
        assert q.shape[1] == k.shape[1] == v.shape[1] == o.shape[0], block  # model width in
        assert q.shape[0] == k.shape[0] and o.shape[1] == v.shape[0], block
        # the parameters themselves or views of them (a fused projection split), never copies
        assert all(
            id(w) in parameters or (w._base is not None and id(w._base) in parameters)
            for w in parts.values()
        ), block


@pytest.mark.parametrize("name", MODELS)
def test_hyperparameters_are_saved_as_plain_values(tmp_path, name):
    model = build(tmp_path, name)
    hparams = dict(model.hparams)
    assert hparams["context_length"] == CONTEXT and hparams["prediction_length"] == HORIZON
    assert hparams["freq"] == "h"
    assert "optimizer" not in hparams and "scheduler" not in hparams
    # weights_only checkpoints hold plain containers only
    plain = (str, int, float, bool, type(None), list, tuple, dict)

    pending = list(hparams.values())
    while pending:
        value = pending.pop()
        assert isinstance(value, plain), type(value)
        if isinstance(value, dict):
            pending += value.values()
        elif isinstance(value, (list, tuple)):
            pending += value
