"""TiRex: parity with the official code on the same weights (the fixture of
tests/fixtures/tirex/make_fixture.py: a tiny random model built and run by the ``tirex-ts``
package 1.4.2 in a side environment, its sLSTM recurrence forced to float32), the loss against
an independent numpy computation, and what a checkpoint must hold and may not do.

Tolerance: float32 against float32 on the same weights, where only the order of summation
differs: 1e-5 for the input layer and every block's output, 1e-5 for every token's quantiles
and 1e-4 for the forecast (three calls, in the batch's scale of values up to ~50). Largest
differences measured (``pytest -s -k official`` prints them): input layer 0; block 0 1.4e-6,
block 1 3.3e-6; every token's quantiles 2.5e-6; the 10-step forecast (three calls, the last
with the window cut to ``train_ctx_len``) 1.4e-5, the same sorted per step (the forecast's
quantiles), its median 7.6e-6. The package's own bfloat16 recurrence lies 0.28 from its float32
one on the same forecast (``forecast_bfloat16`` in the fixture)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.tirex.module import standardisation
from isoprobe.models.tirex.network import isoprobe_name
from isoprobe.probing.capture import capture_outputs
from tests.models.published import built_model, largest_difference

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tirex" / "fixture.npz"
LAYERS, FORECAST = 1e-5, 1e-4
#: the fixture's shape (make_fixture.CONFIG, flattened as a config.json holds it)
SHAPE = {
    "input_patch_size": 4,
    "output_patch_size": 4,
    "embedding_dim": 16,
    "num_heads": 2,
    "num_blocks": 2,
    "input_ff_dim": 24,
    "train_ctx_len": 32,
    "ffn_proj_factor": 2.6667,
    "quantiles": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9],
}
LEVELS = SHAPE["quantiles"]


def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as arrays:
        return dict(arrays)


def published_weights() -> dict[str, torch.Tensor]:
    """The fixture's weights under their published names."""
    return {
        name.removeprefix("weight/"): torch.from_numpy(array)
        for name, array in official().items()
        if name.startswith("weight/")
    }


def hyper_parameters() -> dict:
    """The fixture's shape as a published checkpoint's ``hyper_parameters`` hold it."""
    blocks = {k: SHAPE[k] for k in ("embedding_dim", "num_heads", "num_blocks", "ffn_proj_factor")}
    model = {k: SHAPE[k] for k in ("input_patch_size", "output_patch_size", "input_ff_dim")}
    return {
        "model_config": {**model, "quantiles": LEVELS, "block_kwargs": blocks},
        "train_ctx_len": SHAPE["train_ctx_len"],
    }


def export_directory(directory: Path) -> Path:
    """The fixture as an isoprobe export: config.json + model.safetensors."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"model_type": "tirex", **SHAPE}))
    save_file(published_weights(), str(directory / "model.safetensors"))
    return directory


def published_file(path: Path, **extra) -> Path:
    """The fixture as the published Lightning checkpoint: ``model.ckpt`` (a torch pickle)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        f"block_stack.{k}" if k.startswith("blocks.") else k: v
        for k, v in published_weights().items()
    }
    torch.save({"state_dict": state, "hyper_parameters": hyper_parameters(), **extra}, path)
    return path


def build(tmp_path, checkpoint: str, context: int, horizon: int):
    return built_model(tmp_path, "tirex", checkpoint, context, horizon)


def fixture_model(tmp_path):
    expected = official()
    context = torch.from_numpy(expected["context"])
    horizon = int(expected["horizon"])
    model = build(tmp_path, str(export_directory(tmp_path / "export")), context.shape[1], horizon)
    batch = {
        "context": context,
        "target": torch.zeros(len(context), horizon),
        "loc": torch.zeros(len(context)),
        "scale": torch.ones(len(context)),
    }
    return model, batch, expected


def test_every_layer_matches_the_official_code(tmp_path):
    model, batch, expected = fixture_model(tmp_path)
    layers = model.probe_layers()
    with torch.no_grad(), capture_outputs(layers) as captured:
        model.probe_forward(batch)
    assert largest_difference(captured["embed"][0], expected["embed"], "embed") <= LAYERS
    for index in range(SHAPE["num_blocks"]):
        got = captured[f"decoder.{index}"][0]
        assert largest_difference(got, expected["hidden"][:, :, index], f"block {index}") <= LAYERS


def test_every_tokens_quantiles_match_the_official_code(tmp_path):
    model, batch, expected = fixture_model(tmp_path)
    window = model._window(batch["context"])
    tokens, _ = model._tokens(window, *standardisation(window))
    with torch.no_grad():
        got = model.network(tokens).flatten(-2)
    assert largest_difference(got, expected["outputs"], "quantiles per token") <= LAYERS


def test_the_forecast_past_one_output_patch_matches_the_official_roll_out(tmp_path):
    model, batch, expected = fixture_model(tmp_path)
    with torch.no_grad():
        heads = model._roll_out(batch["context"])
    assert largest_difference(heads, expected["forecast"], "forecast") <= FORECAST
    # the forecast: the same quantiles sorted per step (random weights cross them)
    ordered = np.sort(expected["forecast"], axis=1)
    forecast = model.forecast(batch)
    assert largest_difference(forecast.quantiles, ordered, "sorted forecast") <= FORECAST
    median = ordered[:, LEVELS.index(0.5)]
    assert largest_difference(forecast.median, median, "median") <= FORECAST


def numpy_loss(context: np.ndarray, target: np.ndarray, heads: np.ndarray, patch: int) -> float:
    """The loss of the module docstring, from the window and every token's quantiles alone:
    for each token k of a patch with an observed value (or a masked token), the pinball loss
    of its prediction against the (standardised) steps of patch k + 1 that are observed."""
    window = np.concatenate(
        [np.full((len(context), SHAPE["train_ctx_len"] - context.shape[1]), np.nan), context], 1
    )
    observed = np.isfinite(window)
    mean = np.nansum(window, 1, keepdims=True) / observed.sum(1, keepdims=True)
    scale = np.sqrt(np.nanmean((window - mean) ** 2, 1, keepdims=True))
    series = (np.concatenate([window, target], 1) - mean) / scale
    levels = np.array(LEVELS)
    tokens = SHAPE["train_ctx_len"] // patch
    total, count = 0.0, 0
    for b in range(len(context)):
        for k in range(heads.shape[1]):
            if k < tokens and not observed[b, k * patch : (k + 1) * patch].any():
                continue
            for j in range(patch):
                step = (k + 1) * patch + j
                if step >= series.shape[1] or not np.isfinite(series[b, step]):
                    continue
                errors = series[b, step] - heads[b, k, :, j]
                total += np.maximum(levels * errors, (levels - 1) * errors).mean()
                count += 1
    return total / count


def test_the_loss_is_the_pinball_loss_of_every_real_tokens_next_patch(tmp_path):
    model, batch, _ = fixture_model(tmp_path)
    generator = torch.Generator().manual_seed(5)
    target = torch.randn(3, 10, generator=generator) * 3 + 10
    target[0, 2] = math.nan
    batch = {**batch, "target": target}
    kept = []
    handle = model.network.register_forward_hook(lambda _m, _a, out: kept.append(out))
    try:
        loss = float(model.loss(batch).detach())
    finally:
        handle.remove()
    heads = kept[0].detach().double().numpy()
    assert heads.shape[1] == 8 + 2  # the window's 8 tokens and two masked ones (10 = 4 + 4 + 2)
    expected = numpy_loss(batch["context"].double().numpy(), target.double().numpy(), heads, 4)
    assert loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("given", ["file", "directory"])
def test_the_published_checkpoint_loads_as_data_from_a_file_or_its_directory(tmp_path, given):
    path = published_file(tmp_path / "download" / "model.ckpt")
    model = build(tmp_path, str(path if given == "file" else path.parent), 30, 10)
    assert model.resolved_checkpoint.kind == "path"
    assert model.resolved_checkpoint.location == str(path.resolve())
    loaded = model.network.state_dict()
    for name, tensor in published_weights().items():
        assert loaded[isoprobe_name(name)].equal(tensor), name
    assert len(loaded) == len(published_weights())


def test_an_export_reloads_the_same_weights_and_config(tmp_path):
    model, batch, _ = fixture_model(tmp_path)
    model.export(str(tmp_path / "again"))
    again = build(tmp_path, str(tmp_path / "again"), 30, 10)
    assert again.shape == model.shape
    assert torch.equal(again.forecast(batch).quantiles, model.forecast(batch).quantiles)


def test_weights_that_do_not_fit_the_architecture_are_refused_in_one_message(tmp_path):
    directory = export_directory(tmp_path / "export")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "embedding_dim": 32}))
    with pytest.raises(CheckpointError, match=r"do not fit the TiRex architecture.*shape"):
        build(tmp_path, str(directory), 30, 10)


def test_a_published_checkpoint_missing_a_tensor_is_refused_naming_it(tmp_path):
    path = published_file(tmp_path / "model.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["state_dict"]["out_norm.weight"]
    torch.save(checkpoint, path)
    with pytest.raises(CheckpointError, match=r"1 weights missing .*out_norm\.weight"):
        build(tmp_path, str(path), 30, 10)


def test_a_checkpoint_without_tirex_hyper_parameters_is_refused_naming_them(tmp_path):
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"model_kwargs": {}}}, path)
    with pytest.raises(CheckpointError, match=r"not a TiRex checkpoint.*model_config"):
        build(tmp_path, str(path), 30, 10)


def test_the_attention_site_is_refused_naming_the_model(tmp_path):
    model, _, _ = fixture_model(tmp_path)
    assert model.attends is False and model.attention_weights() == {}
    with pytest.raises(ValueError, match=r"TiRex has no attention.*site=block"):
        model.probe_layers("attention")


def test_a_patch_without_an_observed_value_is_no_token(tmp_path):
    model, batch, _ = fixture_model(tmp_path)
    masks = model.token_masks(batch, ["embed", "decoder.1"])
    # window 1 misses steps 9..14 (of 30, left-padded by 2: steps 11..16 of the window): its
    # patch 3 (steps 12..15) is all missing; window 2 is observed from step 17 (19 of 32) on
    expected = torch.ones(3, 8, dtype=torch.bool)
    expected[1, 3] = False
    expected[2, :4] = False
    assert torch.equal(masks["embed"], expected) and torch.equal(masks["decoder.1"], expected)


def test_the_standardisation_is_the_observed_values_mean_and_population_deviation():
    context = torch.tensor([[math.nan, 1.0, 3.0], [2.0, 2.0, 2.0], [math.nan] * 3])
    mean, scale = standardisation(context)
    assert mean.flatten().tolist() == [2.0, 2.0, 0.0]
    assert scale.flatten().tolist() == pytest.approx([1.0, 2.0 + 1e-5, 1.0])
