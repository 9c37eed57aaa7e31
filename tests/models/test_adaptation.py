"""model.adapt (isoprobe.models.adaptation) on every configs/model/*.yaml: what each strategy
trains, LoRA's adapters on the declared layers (probes and ``attention_weights()`` see the
adapted model), the merged export that reloads with identical forecasts, and Chronos-2's LoRA
equal to chronos-forecasting's own ``Chronos2Pipeline.fit(finetune_mode="lora")``."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pandas as pd
import peft
import pytest
import torch
from chronos import ChronosBoltPipeline
from chronos.chronos2 import Chronos2Pipeline
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch import nn
from transformers.pytorch_utils import Conv1D

from isoprobe.models.adaptation import (
    adapters_merged,
    lora_layers,
    merged_export,
    module_paths,
    parameter_counts,
)
from isoprobe.models.base import LINEAR_TYPES, ForecastModule
from isoprobe.probing.capture import capture_outputs
from isoprobe.tasks import build_model, run_task
from tests.conftest import compose_config
from tests.models.test_contract import MODELS, build, make_batch, seeded_forecast


def adapted(tmp_path, name: str, adapt: str, *overrides: str, checkpoint: str = "scratch"):
    return build(tmp_path, name, checkpoint, [f"model.adapt={adapt}", *overrides])


def perturb_adapters(model: nn.Module) -> None:
    """Non-zero ``B`` (LoRA starts at B = 0, the identity), as after some training."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in lora_layers(model).values():
            for b in layer.lora_B.values():
                b.weight.copy_(0.05 * torch.randn(b.weight.shape, generator=g))


def trainable(model: nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def parameter_names(model: nn.Module, modules: list[nn.Module]) -> set[str]:
    """The names (in ``model``) of the parameters of ``modules``; a tied one by every name."""
    ids = {id(p) for m in modules for p in m.parameters()}
    return {n for n, p in model.named_parameters(remove_duplicate=False) if id(p) in ids}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("adapt", ["frozen_backbone", "head_only"])
def test_frozen_strategies_train_exactly_the_declared_modules(tmp_path, name, adapt):
    model = adapted(tmp_path, name, adapt)
    declared = model.head_modules()
    if adapt == "frozen_backbone":
        declared = [*model.input_modules(), *declared]
    expected = parameter_names(model, declared) & trainable(model)
    assert trainable(model) == expected and expected
    counts = parameter_counts(model)
    assert 0 < counts["trainable_parameters"] < counts["total_parameters"]
    assert counts["total_parameters"] == parameter_counts(build(tmp_path, name))["total_parameters"]


@pytest.mark.parametrize("name", MODELS)
def test_lora_adapts_the_declared_layers_and_trains_only_the_adapters(tmp_path, name):
    model, reference = adapted(tmp_path, name, "lora"), build(tmp_path, name)
    targets = module_paths(reference, reference.lora_target_modules())
    assert sorted(lora_layers(model)) == sorted(targets) and targets
    names = trainable(model)
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert parameter_counts(model)["trainable_parameters"] == sum(
        layer.r["default"] * sum(layer.get_base_layer().weight.shape)
        for layer in lora_layers(model).values()
    )
    with_mlp = adapted(tmp_path, name, "lora", "model.lora.mlp=true", "model.lora.projections=[q]")
    feed_forward = [
        m
        for ff in reference.feed_forward_modules()
        for m in ff.modules()
        if isinstance(m, LINEAR_TYPES)
    ]
    assert set(module_paths(reference, feed_forward)) <= set(lora_layers(with_mlp))


def applied(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x`` through a layer holding ``layer.weight`` (Conv1D's is [in, out])."""
    base = layer.get_base_layer()
    if isinstance(base, Conv1D):
        return x @ layer.weight + base.bias
    return nn.functional.linear(x, layer.weight, base.bias)


@pytest.mark.parametrize("name", MODELS)
def test_probes_and_attention_weights_see_the_adapted_model(tmp_path, name):
    model, reference = adapted(tmp_path, name, "lora"), build(tmp_path, name)
    perturb_adapters(model)
    for path, layer in lora_layers(model).items():
        base = layer.get_base_layer()
        x = torch.randn(3, base.weight.shape[0 if isinstance(base, Conv1D) else 1])
        torch.testing.assert_close(layer(x), applied(layer, x), msg=path)
    adapted_weights, base_weights = model.attention_weights(), reference.attention_weights()
    assert list(adapted_weights) == list(base_weights)
    for block, parts in adapted_weights.items():
        for part, weight in parts.items():
            assert weight.shape == base_weights[block][part].shape
            assert not torch.equal(weight, base_weights[block][part]), (block, part)
    for site in ("block", "attention") if model.attends else ("block",):
        layers = model.probe_layers(site)
        with torch.no_grad(), capture_outputs(layers) as captured:
            model.probe_forward(make_batch())
        assert all(len(outputs) == 1 for outputs in captured.values()), site
        assert set(model.token_masks(make_batch(), list(layers))) == set(layers)
    with torch.no_grad(), capture_outputs(model.probe_layers()) as adapted_out:
        model.probe_forward(make_batch())
    with torch.no_grad(), capture_outputs(reference.probe_layers()) as base_out:
        reference.probe_forward(make_batch())
    last = list(adapted_out)[-1]
    assert not torch.equal(adapted_out[last][0], base_out[last][0])


@pytest.mark.parametrize("name", MODELS)
def test_the_lora_export_is_merged_and_reloads_with_the_same_forecasts(tmp_path, name):
    """The export holds the merged weights exactly; forecasts agree to float rounding (the
    same weights at another address may take another BLAS path, so not always bitwise)."""
    model = adapted(tmp_path, name, "lora")
    perturb_adapters(model)
    batch = make_batch()
    merged_export(model, str(tmp_path / "export"))
    assert lora_layers(model)  # the adapters are back after the export
    reloaded = build(tmp_path, name, checkpoint=str(tmp_path / "export"))
    assert not lora_layers(reloaded)
    with adapters_merged(model):
        merged = model.state_dict()
        expected = seeded_forecast(model, batch)
    assert merged.keys() == reloaded.state_dict().keys()
    assert all(torch.equal(merged[k], v) for k, v in reloaded.state_dict().items())
    again = seeded_forecast(reloaded, batch)
    torch.testing.assert_close(again.quantiles, expected.quantiles, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(again.median, expected.median, rtol=1e-5, atol=1e-4)
    adapters = seeded_forecast(model, batch)  # computed as LoRA computes, unmerged
    torch.testing.assert_close(again.median, adapters.median, rtol=1e-5, atol=1e-4)
    assert not torch.equal(again.median, seeded_forecast(build(tmp_path, name), batch).median)


@pytest.mark.parametrize(
    "name, pipeline", [("chronos_bolt", ChronosBoltPipeline), ("chronos2", Chronos2Pipeline)]
)
def test_the_official_pipeline_reads_the_merged_lora_export(tmp_path, name, pipeline):
    model = adapted(tmp_path, name, "lora")
    perturb_adapters(model)
    merged_export(model, str(tmp_path / "export"))
    context = list(make_batch()["context"][1:])  # whole windows
    official = pipeline.from_pretrained(str(tmp_path / "export")).predict(context, 8)
    with adapters_merged(model):
        in_memory = pipeline(model.model).predict(context, 8)
    for a, b in zip(official, in_memory, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


class Wrapped(Exception):
    """Stops Chronos2Pipeline.fit once it has wrapped its model for LoRA."""


def test_chronos2_lora_trains_what_the_official_lora_fit_trains(tmp_path, monkeypatch):
    model = adapted(tmp_path, "chronos2", "lora", checkpoint="bundled")
    pipeline = Chronos2Pipeline(build(tmp_path, "chronos2", "bundled").model)
    wrapped = {}

    def wrap_and_stop(inner, config, *args, **kwargs):
        wrapped["model"] = real(inner, config, *args, **kwargs)
        raise Wrapped

    real = peft.get_peft_model
    monkeypatch.setattr(peft, "get_peft_model", wrap_and_stop)
    with pytest.raises(Wrapped):
        pipeline.fit([torch.randn(200)], prediction_length=16, finetune_mode="lora")
    official = {n.removeprefix("base_model.model.") for n in trainable(wrapped["model"])}
    assert {n.removeprefix("model.") for n in trainable(model)} == official
    assert wrapped["model"].get_nb_trainable_parameters()[0] == sum(
        p.numel() for p in model.parameters() if p.requires_grad
    )


@pytest.mark.parametrize("name", MODELS)
def test_the_training_memory_estimate_keeps_no_optimiser_state_for_frozen_weights(tmp_path, name):
    """A parameter head_only freezes has no gradient and no AdamW moments: 3 x 4 bytes less per
    element than under full fine-tuning (where a fixed buffer-like parameter, such as PatchTST's
    sin-cos positions, has none either), and forecasting needs the same memory either way."""
    full = adapted(tmp_path, name, "full")
    head_only = adapted(tmp_path, name, "head_only")

    def training(model):
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    frozen = training(full) - training(head_only)
    assert frozen > 0
    saved = full.training_memory_bytes(4) - head_only.training_memory_bytes(4)
    assert saved == 12 * frozen
    assert full.forecast_memory_bytes(4) == head_only.forecast_memory_bytes(4)


def test_an_unknown_strategy_or_projection_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"model.adapt must be one of \['full', 'lora'"):
        adapted(tmp_path, "patchtst", "everything")
    with pytest.raises(ValueError, match=r"model.lora.projections .* got \['x'\]"):
        adapted(tmp_path, "patchtst", "lora", "model.lora.projections=[x]")


def test_lora_on_factored_projections_is_refused(tmp_path):
    with pytest.raises(ValueError, match="model.adapt=lora .* factored"):
        adapted(tmp_path, "patchtst", "lora", "model.low_rank.enabled=true")


def probed_outputs(model: ForecastModule, layers: list[str]) -> dict[str, torch.Tensor]:
    """Every layer's output of one probe pass, in eval mode as the probe runs it."""
    training = model.training
    model.eval()
    with torch.no_grad(), capture_outputs(model.probe_layers()) as captured:
        model.probe_forward(make_batch())
    model.train(training)
    return {layer: captured[layer][0].clone() for layer in layers}


def frozen_modules(model: ForecastModule) -> dict[str, nn.Module]:
    """Path -> every module inside a module whose parameters (one at least) are all frozen."""
    tops = [
        path
        for path, module in model.named_modules()
        if (parameters := list(module.parameters()))
        and not any(p.requires_grad for p in parameters)
    ]
    return {
        path: module
        for path, module in model.named_modules()
        if any(path == top or path.startswith(f"{top}.") for top in tops)
    }


def buffers_of(modules: dict[str, nn.Module]) -> dict[str, torch.Tensor]:
    return {
        f"{path}.{name}": buffer.clone()
        for path, module in modules.items()
        for name, buffer in module.named_buffers(recurse=False)
    }


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("adapt", ["lora", "frozen_backbone", "head_only"])
def test_what_a_strategy_freezes_stays_in_eval_mode_through_training(tmp_path, name, adapt):
    """model.train(), as Lightning calls it at every epoch, leaves every module the strategy
    froze (its parameters all frozen) in eval mode and puts the rest in training mode; training
    steps change no buffer of a frozen module, and under head_only no probed layer (unless
    the head is tied to the input embedding, Chronos-T5's and GPT-2's, which then trains)."""
    model = adapted(tmp_path, name, adapt)
    modules = frozen_modules(model)
    frozen = {id(m) for m in modules.values()}
    assert frozen, "the strategy froze nothing"
    if adapt != "lora":
        assert all(id(trained) not in frozen for trained in model.head_modules())
    layers = list(model.probe_layers())
    before, buffers = probed_outputs(model, layers), buffers_of(modules)
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.01)
    for _ in range(2):
        model.train()
        assert all(m.training == (id(m) not in frozen) for m in model.modules())
        optimiser.zero_grad()
        model.loss(make_batch()).backward()
        optimiser.step()
    after = buffers_of(modules)
    assert all(torch.equal(after[key], value) for key, value in buffers.items())
    tied = any(p.requires_grad for m in model.input_modules() for p in m.parameters())
    if adapt == "head_only" and not tied:
        moved = probed_outputs(model, layers)
        assert all(torch.equal(moved[layer], before[layer]) for layer in layers)


@pytest.mark.parametrize("adapt", ["frozen_backbone", "head_only"])
def test_patchtst_frozen_batchnorm_keeps_its_statistics_through_a_run(tiny_config, tmp_path, adapt):
    """The trial's run (the bundled PatchTST, whose encoder is BatchNorm-normalised): after an
    epoch the frozen encoder's running means and variances are the bundled ones bit for bit,
    and under head_only every probed value after the epoch is the value before it."""
    overrides = ["model.checkpoint=bundled", f"model.adapt={adapt}", "logger=none"]
    overrides += [
        "data.context_length=512",
        "data.prediction_length=64",
        "callbacks.probe.measures=[isotropy,cka,readout]",
    ]
    overrides += ["task.evaluate_before=false", "task.evaluate_after=false"]
    cfg = tiny_config(*overrides, model="patchtst")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", ".* in eval mode", PossibleUserWarning)  # on purpose
        run_task(cfg)
    trained = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    windows = SimpleNamespace(context_length=512, prediction_length=64, season_length=1, freq="h")
    bundled = build_model(cfg.model, windows).state_dict()
    statistics = [k for k in bundled if k.endswith(("running_mean", "running_var"))]
    assert statistics and all(".encoder." in k for k in statistics)
    assert all(torch.equal(trained[k], bundled[k]) for k in statistics)
    probed = pd.read_csv(tmp_path / "probe_metrics.csv")
    assert set(probed["epoch"]) == {0, 1}
    values = probed.pivot_table(index=["layer", "metric"], columns="epoch", values="value")
    if adapt == "head_only":
        assert values[0].equals(values[1])


#: the models whose forecasts are sampled from the global random generator
SAMPLING_MODELS = ("chronos", "lag_llama", "llm", "moirai")


@pytest.mark.parametrize("name", MODELS)
def test_no_strategy_draws_from_the_run_s_random_stream(tmp_path, name):
    """Building with any ``model.adapt`` leaves the global generator where building the model
    alone does: LoRA initialises its adapters from a generator of its own."""
    states = {}
    for adapt in ("full", "lora", "frozen_backbone", "head_only"):
        adapted(tmp_path, name, adapt)  # seeds 0, then builds
        states[adapt] = torch.get_rng_state()
    assert all(torch.equal(state, states["full"]) for state in states.values())


@pytest.mark.parametrize("name", SAMPLING_MODELS)
def test_lora_leaves_the_zero_shot_sampled_forecast_as_it_is(tmp_path, name):
    """The zero-shot ("before") forecast of a run is drawn right after the model is built: with
    LoRA's adapters at B = 0 (the identity) it equals full fine-tuning's, sample for sample."""
    batch = make_batch()
    full = adapted(tmp_path, name, "full").forecast(batch)
    lora = adapted(tmp_path, name, "lora").forecast(batch)
    assert full.samples is not None and lora.samples is not None
    torch.testing.assert_close(lora.samples, full.samples, rtol=0, atol=0)
    torch.testing.assert_close(lora.quantiles, full.quantiles, rtol=0, atol=0)


def test_lora_initialisation_is_seeded_by_the_run_alone(tmp_path):
    """The adapters' random A depends on the seed the run gave torch, not on what the process
    drew after it: the same seed gives the same adapters, another seed others."""
    overrides = ["model=chronos", "model.checkpoint=scratch", "model.adapt=lora"]
    cfg = compose_config(tmp_path, overrides)
    windows = SimpleNamespace(context_length=32, prediction_length=8, season_length=1, freq="h")

    def adapters(seed: int, drawn: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        torch.rand(drawn)  # what the process drew between seeding and adapting
        model = build_model(cfg.model, windows)
        return {k: v for k, v in model.state_dict().items() if ".lora_A." in k}

    first, again, other = adapters(0, 0), adapters(0, 7), adapters(1, 0)
    assert first and all(torch.equal(first[k], again[k]) for k in first)
    assert not any(torch.equal(first[k], other[k]) for k in first)
