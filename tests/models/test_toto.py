"""Toto: parity with the official code on the same weights (the fixture of
tests/fixtures/toto/make_fixture.py: a tiny random Toto built and run by the ``toto-ts`` package
0.2.0 in a side environment), the loss against an independent numpy/scipy computation, the
sampled forecast against the package's samples, and what a checkpoint directory must hold.

Tolerance: float32 against float32 on the same weights and the same kernels (PyTorch's
attention), where only the order of summation may differ: 1e-5 for every layer, the scaler's
statistics and the mixture's parameters, 1e-6 relative for the loss. Largest differences
measured (``pytest -s tests/models/test_toto.py`` prints them): the patch embedding, the
first space-wise layer and the scaler's loc and scale 0.0 (bit-identical); the blocks <= 3.6e-7,
the time-wise attentions <= 2.4e-7; the mixture's df 2.4e-7, loc 1.8e-7, scale 1.2e-7, weights
6.0e-8; the loss 0.0; with the space-wise layers last (``spacewise-last``) the blocks <= 7.2e-7,
the attentions <= 2.4e-7, the mixture <= 2.4e-7; the KV cache's passes (the context, then
one appended patch at a time) against one pass over the whole series: the mixture <= 3.6e-7.
The package draws every position's mixture
and keeps the last patch's, isoprobe draws only the last patch's, so seeded draws differ: their
quantiles are compared as estimates of the same distribution, 2000 paths each, within 0.3 of
the package's per-step standard deviation (one comparison's sampling error is about 0.05 of it
at the 0.1 and 0.9 levels; the largest of the 216 gaps measured is 0.16)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from scipy import special, stats

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.toto.config import (
    TotoShape,
    official_config,
    parameter_count,
    shape_from_fields,
)
from isoprobe.models.toto.network import (
    KeyValueCache,
    TotoNetwork,
    block_layers,
    causal_patch_statistics,
)
from isoprobe.probing.capture import capture_outputs
from tests.conftest import compose_config
from tests.models.published import built_model, copied_checkpoint, largest_difference

FIXTURE = Path(__file__).parents[1] / "fixtures" / "toto"
#: the same kind of model with its space-wise layers last in their groups
SPACEWISE_LAST = FIXTURE / "spacewise-last"
LAYERS, LOSS = 1e-5, 1e-6
#: Datadog/Toto-Open-Base-1.0's config.json (its comment names the sources) and the parameters
#: toto-ts 0.2.0's TotoBackbone has when built from it (the package's README: 151M)
PUBLISHED = FIXTURE / "published-config.yaml"
PUBLISHED_PARAMETERS = 151_306_080
#: sampled quantiles may differ by this fraction of the package's per-step standard deviation
SAMPLED = 0.3


def official(where: Path = FIXTURE) -> dict[str, np.ndarray]:
    with np.load(where / "outputs.npz") as outputs:
        return dict(outputs)


def build(tmp_path, checkpoint: str, context: int = 24, horizon: int = 8, *overrides: str):
    return built_model(tmp_path, "toto", checkpoint, context, horizon, overrides)


def fixture_model(tmp_path, *overrides: str, where: Path = FIXTURE):
    """The fixture's model (``where``: the main one or ``spacewise-last``) on the raw values
    (``standardise=false``: the official pipeline), the fixture's windows and outputs."""
    expected = official(where)
    model = build(tmp_path, str(where), 24, 8, "model.standardise=false", *overrides)
    batch = {
        "context": torch.from_numpy(expected["context"]),
        "target": torch.from_numpy(official()["target"]),
        "loc": torch.zeros(3),
        "scale": torch.ones(3),
    }
    return model, batch, expected


@pytest.mark.parametrize("where", [FIXTURE, SPACEWISE_LAST], ids=["first", "last"])
def test_every_layer_matches_the_official_code(tmp_path, where):
    """The patch embedding, every block (its time-wise layer's output, or its space-wise
    layer's where that comes last), every time-wise attention and the space-wise layers inside
    the blocks, on the context's one pass; space-wise layers first and last in their groups."""
    model, batch, expected = fixture_model(tmp_path, where=where)
    network = model.network
    layers = {**model.probe_layers("block"), **model.probe_layers("attention")}
    official_of = {"embed": "embed"}
    for i, (time, space) in enumerate(block_layers(model.shape)):
        last = time if model.shape.spacewise_first else space
        official_of |= {f"decoder.{i}": f"layer.{last}", f"decoder.{i}.attn": f"attention.{time}"}
        space_layer = network.blocks[i].space
        layers |= {f"space.{i}": space_layer, f"space.{i}.attn": space_layer.attention}
        official_of |= {f"space.{i}": f"layer.{space}", f"space.{i}.attn": f"attention.{space}"}
    series = model._series(batch["context"])
    with torch.no_grad(), capture_outputs(layers) as captured:
        model._run(series, series.shape[-1])
    assert len(layers) == 1 + 4 * len(network.blocks)
    for name, module_output in captured.items():
        difference = largest_difference(module_output[0], expected[official_of[name]], name)
        assert difference < LAYERS


@pytest.mark.parametrize("where", [FIXTURE, SPACEWISE_LAST], ids=["first", "last"])
def test_the_scaler_and_the_mixture_match_the_official_code(tmp_path, where):
    model, batch, expected = fixture_model(tmp_path, where=where)
    series = model._series(batch["context"])
    with torch.no_grad():
        _, (df, mu, sigma, logits), loc, scale = model._run(series, series.shape[-1])
    got = {"loc": loc, "scale": scale, "df": df, "mu": mu, "sigma": sigma}
    got["weights"] = logits.softmax(-1)
    for name, tensor in got.items():
        assert largest_difference(tensor, expected[name], name) < LAYERS


def test_the_loss_matches_the_official_fine_tuning_loss(tmp_path):
    """``TotoForFinetuning``'s training loss on the window context + one patch of target."""
    model, batch, expected = fixture_model(tmp_path)
    with torch.no_grad():
        loss = model.loss(batch)
    print(f"parity loss: {abs(float(loss) - float(expected['loss'])):.1e}")
    assert float(loss) == pytest.approx(float(expected["loss"]), rel=LOSS)


def numpy_statistics(series: np.ndarray, patch: int, prefix: int) -> tuple[np.ndarray, ...]:
    """Each step's loc and scale from the definition: the mean and Bessel-corrected variance
    of the observed values up to the end of its patch, ``sqrt(var + 0.1)``, clamped to
    ``[max(0.1, g 1e-10), g 1e10]`` with ``g = sqrt(population var + 0.1)`` of the first
    ``prefix`` steps' observed values."""
    loc, scale = np.zeros_like(series), np.zeros_like(series)
    for row in range(len(series)):
        head = series[row, :prefix]
        head = head[np.isfinite(head)]
        overall = np.sqrt(head.var() + 0.1)
        for end in range(patch, series.shape[1] + 1, patch):
            seen = series[row, :end]
            seen = seen[np.isfinite(seen)]
            mean = seen.mean() if len(seen) else 0.0
            variance = seen.var(ddof=1) if len(seen) > 1 else 0.0
            step = np.clip(np.sqrt(variance + 0.1), max(0.1, overall * 1e-10), overall * 1e10)
            loc[row, end - patch : end], scale[row, end - patch : end] = mean, step
    return loc, scale


def test_the_loss_is_the_official_combination_computed_independently(tmp_path):
    """Against numpy/scipy from the head's own outputs: left padding, a gap in the context,
    missing target steps, a target longer than a patch (right-padded). Per observed step ``y``
    at ``t + 4``: ``z = (y - loc_t) / (scale_t + eps)``, ``0.575 (-log Σ π_k t(z; ν_k, μ_k,
    σ_k)) + 0.425 log(1 + (Σ π_k μ_k - z)^2 / 0.02)``, averaged."""
    model, _, _ = fixture_model(tmp_path)
    rng = np.random.default_rng(4)
    context = rng.normal(5.0, 2.0, size=(2, 22)).astype(np.float32)
    target = rng.normal(5.0, 2.0, size=(2, 7)).astype(np.float32)
    context[0, :5] = np.nan
    context[1, 9:14] = np.nan
    target[1, 2:4] = np.nan
    batch = {"context": torch.from_numpy(context), "target": torch.from_numpy(target)}
    outputs = []
    hook = model.network.output_distribution.register_forward_hook(
        lambda _module, _args, output: outputs.append(output)
    )
    with torch.no_grad():
        loss = float(model.loss(batch))
    hook.remove()
    df, mu, sigma, logits = (t[:, 0].double().numpy() for t in outputs[0])
    series = np.concatenate(
        [np.full((2, 2), np.nan), context, target, np.full((2, 1), np.nan)], axis=1
    ).astype(np.float64)
    loc, scale = numpy_statistics(series, 4, 24)
    log_weights = logits - special.logsumexp(logits, axis=-1, keepdims=True)
    eps = float(np.finfo(np.float32).eps)
    terms = []
    for row in range(2):
        for t in range(series.shape[1] - 4):
            y = series[row, t + 4]
            if not np.isfinite(y):
                continue
            z = (y - loc[row, t]) / (scale[row, t] + eps)
            density = stats.t.logpdf(z, df[row, t], mu[row, t], sigma[row, t])
            nll = -special.logsumexp(log_weights[row, t] + density)
            mean = np.exp(log_weights[row, t]) @ mu[row, t]
            terms.append(0.575 * nll + 0.425 * np.log1p(0.5 * ((mean - z) / 0.1) ** 2))
    assert loss == pytest.approx(np.mean(terms), rel=1e-5)


def test_the_causal_patch_scaler_is_its_definition():
    rng = np.random.default_rng(0)
    values = rng.normal(3.0, 2.0, size=(2, 16))
    values[0, :5] = np.nan
    values[1, 6:9] = np.nan
    tensor = torch.from_numpy(values)[:, None]
    shape = TotoShape(4, 4, 2, 1, 1, 1, spacewise_every_n_layers=-1)
    loc, scale = causal_patch_statistics(tensor.nan_to_num(0.0), tensor.isfinite(), shape, 12)
    expected_loc, expected_scale = numpy_statistics(values, 4, 12)
    np.testing.assert_allclose(loc[:, 0].numpy(), expected_loc, atol=1e-12)
    np.testing.assert_allclose(scale[:, 0].numpy(), expected_scale, atol=1e-12)


def test_sampled_quantiles_follow_the_official_forecasters_samples(tmp_path):
    """Two patches of 2000 paths each (the second patch drawn from the first's draws): every
    level's empirical quantile within 0.3 of the package's per-step standard deviation."""
    model, batch, expected = fixture_model(tmp_path, "model.num_samples=2000")
    torch.manual_seed(0)
    forecast = model.forecast(batch)
    theirs = expected["samples"][:, 0].transpose(0, 2, 1)  # [B, S, H]
    levels = np.array(model.quantile_levels)
    their_quantiles = np.quantile(theirs, levels, axis=1).transpose(1, 0, 2)
    gap = (
        np.abs(forecast.quantiles.double().numpy() - their_quantiles) / theirs.std(axis=1)[:, None]
    )
    print(f"parity sampled quantiles: {gap.max():.2f} standard deviations")
    assert gap.max() < SAMPLED


@pytest.mark.parametrize("where", [FIXTURE, SPACEWISE_LAST], ids=["first", "last"])
def test_passes_through_the_kv_cache_give_the_whole_series_mixture(tmp_path, where):
    """A pass over the context, then one over each appended patch alone (reading the cached
    keys and values, as the forecast's roll-out does), give every step's mixture as one pass
    over the whole series does (within the layers' tolerance: only rounding differs)."""
    model, batch, _ = fixture_model(tmp_path, where=where)
    series = model._series(batch["context"])
    appended = torch.randn(3, 1, 8, generator=torch.Generator().manual_seed(0)) * 2 + 5
    whole = torch.cat([series, appended], dim=-1)
    start = series.shape[-1]
    cache = KeyValueCache()
    with torch.no_grad():
        _, expected, _, _ = model._run(whole, start)
        parts = [model._run(whole[..., :end], start, cache)[1] for end in (start, start + 4)]
        parts.append(model._run(whole, start, cache)[1])
    for i, name in enumerate(("df", "loc", "scale", "weights")):
        cached = torch.cat([part[i] for part in parts], dim=2)
        assert largest_difference(cached, expected[i].numpy(), f"kv cache {name}") < LAYERS


def test_forecasts_are_seeded_and_draw_every_path(tmp_path):
    model, batch, _ = fixture_model(tmp_path, "model.num_samples=5")
    draws = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        draws.append(model.forecast(batch).samples)
    assert draws[0].shape == (3, 5, 8)
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert (draws[0].std(dim=1) > 0).all()


def test_the_fixture_weights_carry_the_official_names(tmp_path):
    model, _, _ = fixture_model(tmp_path)
    names = set(load_file(FIXTURE / "model.safetensors"))
    model.export(str(tmp_path / "export"))
    assert set(load_file(tmp_path / "export" / "model.safetensors")) == names
    assert {"model.transformer.layers.0.attention.wQKV.weight", "model.unembed.weight"} <= names


def test_fused_swiglu_names_and_the_rotary_buffer_load(tmp_path):
    """The package's xFormers names (``mlp.0.w12``, ``mlp.0.w3``) and a stored rotary
    ``freqs`` buffer, as some of its checkpoints hold them, load into the same weights."""
    directory = copied_checkpoint(FIXTURE, tmp_path)
    weights = load_file(directory / "model.safetensors")
    fused = {
        name.replace("mlp.0.", "mlp.0.w12.").replace("mlp.2.", "mlp.0.w3."): tensor
        for name, tensor in weights.items()
    }
    fused["model.transformer.rotary_emb.freqs"] = torch.ones(4)
    save_file(fused, str(directory / "model.safetensors"))
    reloaded = build(tmp_path, str(directory)).network.state_dict()
    original = build(tmp_path, str(FIXTURE)).network.state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in original.items())


def test_weights_that_do_not_fit_the_config_are_refused_in_one_message(tmp_path):
    """The tiny weights under a config of another width: the first tensor that differs, with
    both shapes."""
    directory = copied_checkpoint(FIXTURE, tmp_path, embed_dim=32)
    with pytest.raises(
        CheckpointError,
        match=r"do not fit the Toto its config.json describes: patch_embed.projection.weight "
        r"has shape \(16, 4\) in the checkpoint but \(32, 4\) in the model",
    ):
        build(tmp_path, str(directory))


def test_weights_missing_a_tensor_are_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path)
    weights = load_file(directory / "model.safetensors")
    del weights["model.transformer.layers.2.norm2.scale"]
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 weights missing \(e.g. \['blocks.1.space.norm2"):
        build(tmp_path, str(directory))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"num_heads": 3}, r"embed_dim=16 is not a multiple of num_heads=3"),
        ({"stride": 2}, r"stride=2 differs from patch_size=4"),
        ({"spacewise_every_n_layers": 3}, r"spacewise_every_n_layers=3 is neither -1 nor"),
        ({"scaler_cls": "<class 'model.scaler.StdMeanScaler'>"}, r"scaler_cls=.*StdMeanScaler"),
        (
            {"output_distribution_classes": ["<class 'model.distribution.StudentTOutput'>"]},
            r"output_distribution_classes=.*StudentTOutput",
        ),
        ({"num_layers": "4"}, r"num_layers is '4'; expected a whole number"),
        ({"output_distribution_kwargs": 3}, r"output_distribution_kwargs is 3, not a JSON obj"),
        ({"model_type": "toto"}, r"unexpected keys \['model_type'\]"),
    ],
)
def test_a_config_isoprobe_cannot_build_is_refused_naming_the_field(tmp_path, change, named):
    directory = copied_checkpoint(FIXTURE, tmp_path, **change)
    with pytest.raises(CheckpointError, match=named):
        build(tmp_path, str(directory))


def test_an_export_reloads_the_same_weights_and_config(tmp_path):
    model, _, _ = fixture_model(tmp_path)
    model.export(str(tmp_path / "export"))
    exported = load_file(tmp_path / "export" / "model.safetensors")
    original = load_file(FIXTURE / "model.safetensors")
    assert all(torch.equal(exported[k], original[k]) for k in original)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    published = json.loads((FIXTURE / "config.json").read_text())
    assert config == published


def test_standardising_makes_the_forecast_follow_the_scale_and_raw_values_do_not(tmp_path):
    """With ``standardise`` the forecast of ``c`` times a window is ``c`` times its forecast;
    the official pipeline on raw values is not (its scaler adds 0.1 to every variance)."""
    _, batch, _ = fixture_model(tmp_path)
    small = {**batch, "context": batch["context"] * 0.01}
    for standardise, follows in (("true", True), ("false", False)):
        model = build(tmp_path, str(FIXTURE), 24, 8, f"model.standardise={standardise}")
        medians = []
        for scaled, factor in ((batch, 1.0), (small, 100.0)):
            torch.manual_seed(3)
            medians.append(model.forecast(scaled).median * factor)
        assert torch.allclose(medians[0], medians[1], rtol=1e-4, atol=1e-4) == follows


def test_another_models_checkpoint_is_refused_saying_what_toto_loads(tmp_path):
    """The TimesFM 2.5 parity fixture given to model=toto: its keys named, and what loads."""
    other = Path(__file__).parents[1] / "fixtures" / "timesfm25"
    with pytest.raises(
        CheckpointError, match=r"unexpected keys \['decode_index', .*model=toto loads Toto"
    ):
        build(tmp_path, str(other))


@pytest.mark.parametrize(
    ("every", "first", "blocks"),
    [
        (2, True, [(1, 0), (3, 2)]),
        (2, False, [(0, 1), (2, 3)]),
        (4, True, [(1, 0), (2, None), (3, None)]),
        (-1, True, [(0, None), (1, None), (2, None), (3, None)]),
    ],
)
def test_each_block_is_a_time_wise_layer_with_its_space_wise_neighbour(every, first, blocks):
    """The package's layer order (one space-wise layer per group of ``every``, first or last)
    grouped into blocks of (time-wise layer, the space-wise one just before or after it)."""
    shape = TotoShape(4, 4, 8, 4, 2, 8, spacewise_every_n_layers=every, spacewise_first=first)
    assert block_layers(shape) == blocks


def test_a_space_wise_attention_over_one_variate_is_its_value_and_output_maps(tmp_path):
    """The softmax of one score is 1: the space-wise attention gives each token's own value
    (``wQKV``'s v rows, laid out (head_dim, head), read per head) through ``wO``, so its q and k
    act on nothing (why :meth:`attention_weights` leaves it out)."""
    model, _, _ = fixture_model(tmp_path)
    attention = model.network.blocks[0].space.attention
    x = torch.randn(2, 1, 5, 16)
    width, heads = x.shape[-1], attention.heads
    value = torch.nn.functional.linear(
        x, attention.wQKV.weight[2 * width :], attention.wQKV.bias[2 * width :]
    )
    per_head = value.unflatten(-1, (width // heads, heads)).transpose(-1, -2).flatten(-2)
    with torch.no_grad():
        torch.testing.assert_close(attention(x), attention.wO(per_head))


def test_the_published_config_builds_the_published_network(tmp_path):
    """The published config.json passes as it is, builds 12 layers of which the last attends
    across variates, has the package's parameter count (network and schema estimate), is what
    an export writes back, and ``model.sizes.official_base`` builds the same shape."""
    published = yaml.safe_load(PUBLISHED.read_text())
    shape = shape_from_fields(published, "Toto-Open-Base-1.0/config.json")
    assert shape.layer_is_spacewise() == [False] * 11 + [True]
    assert official_config(shape) == published
    with torch.device("meta"):
        network = TotoNetwork(shape)
    assert sum(p.numel() for p in network.parameters()) == PUBLISHED_PARAMETERS
    assert parameter_count(published) == PUBLISHED_PARAMETERS
    sizes = compose_config(tmp_path, ["model=toto"]).model.sizes
    assert shape_from_fields(OmegaConf.to_container(sizes.official_base), "sizes") == shape
