"""Chronos-T5 wrapper: loss, token masks, forecasts and checkpoints against independent paths."""

from __future__ import annotations

import dataclasses
import json
import shutil
from functools import partial
from pathlib import Path

import pytest
import torch
from chronos import ChronosConfig, ChronosPipeline, MeanScaleUniformBins
from omegaconf import OmegaConf
from transformers import T5Config, T5ForConditionalGeneration

from isoprobe.models.checkpoints import CheckpointError, bundled_path
from isoprobe.models.chronos.t5 import ChronosT5Module
from isoprobe.tasks.resume import check_resume_checkpoint

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/chronos.yaml")
#: the scratch shapes (``model.sizes``); ``mini`` is the bundled checkpoint's
SIZES = OmegaConf.to_container(CONFIG.sizes)
CONTEXT, HORIZON = 24, 8


def make_module(checkpoint: str = "scratch", **kwargs) -> ChronosT5Module:
    torch.manual_seed(0)
    mini = {**SIZES["mini"], "num_layers": 2, "num_decoder_layers": 2}
    module = ChronosT5Module(
        checkpoint=checkpoint,
        sizes={"mini": mini},
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=HORIZON,
        num_samples=6,
        **kwargs,
    )
    return module.eval()


def make_batch(batch_size: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    context = torch.randn(batch_size, CONTEXT, generator=g).cumsum(-1) + 10
    context[0, :5] = float("nan")  # left padding / missing values
    target = torch.randn(batch_size, HORIZON, generator=g) + 10
    target[1, 3] = float("nan")
    return {
        "context": context,
        "target": target,
        "loc": torch.zeros(batch_size),
        "scale": torch.ones(batch_size),
    }


def test_loss_equals_plain_t5_cross_entropy_on_chronos_tokens():
    module, batch = make_module(), make_batch()
    tokenizer = MeanScaleUniformBins(-15.0, 15.0, module.chronos_config)
    ids, mask, scale = tokenizer.context_input_transform(batch["context"])
    labels, label_mask = tokenizer.label_input_transform(batch["target"], scale)
    labels[~label_mask] = -100
    expected = module.t5(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert torch.allclose(module.loss(batch), expected)


def test_token_masks_keep_only_observed_values():
    module, batch = make_module(), make_batch()
    masks = module.token_masks(batch, ["embed", "encoder.0", "decoder.1", "decoder.1.attn"])
    encoder = masks["encoder.0"]
    assert encoder.shape == (3, CONTEXT + 1)  # + EOS
    assert not encoder[:, -1].any()  # EOS is not a context token
    assert encoder[0].sum() == CONTEXT - 5 and encoder[1:].sum() == 2 * CONTEXT
    assert torch.equal(masks["embed"], encoder)
    decoder = masks["decoder.1"]
    assert torch.equal(masks["decoder.1.attn"], decoder)
    assert decoder.shape == (3, HORIZON + 1)
    assert not decoder[:, 0].any()  # the decoder start token
    assert decoder.sum() == 3 * HORIZON - 1  # one missing target value
    with pytest.raises(KeyError, match="unknown Chronos-T5 layer"):
        module.token_masks(batch, ["lm_head"])


def test_probe_layers_capture_embedding_and_every_block():
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
    ids, _, _ = module.tokenizer.context_input_transform(batch["context"])
    assert torch.equal(captured["embed"], module.t5.shared(ids))
    assert captured["encoder.1"][0].shape == (3, CONTEXT + 1, 128)
    assert captured["decoder.0"][0].shape == (3, HORIZON + 1, 128)


def test_forecast_quantiles_are_ordered_and_median_is_the_half_quantile():
    module, batch = make_module(), make_batch()
    torch.manual_seed(0)
    forecast = module.forecast(batch)
    q = forecast.quantiles
    assert q.shape == (3, 9, HORIZON) and forecast.samples.shape == (3, 6, HORIZON)
    assert (q[:, 1:] >= q[:, :-1]).all()
    assert torch.allclose(forecast.median, q[:, 4])
    # every sample decodes to a bin centre times the context's mean |x| scale
    scale = batch["context"].nan_to_num().abs().sum(-1) / (~batch["context"].isnan()).sum(-1)
    centres = module.tokenizer.centers
    values = forecast.samples / scale.view(-1, 1, 1)
    assert torch.isclose(values.unsqueeze(-1), centres, atol=1e-4).any(-1).all()


def test_export_then_load_reproduces_weights_and_loss(tmp_path):
    module, batch = make_module(), make_batch()
    module.export(str(tmp_path / "export"))
    loaded = make_module(checkpoint=str(tmp_path / "export"))
    assert loaded.resolved_checkpoint.kind == "path"
    for (name, a), (_, b) in zip(
        module.state_dict().items(), loaded.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert torch.allclose(module.loss(batch), loaded.loss(batch))


def test_bad_checkpoints_fail_with_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        make_module(checkpoint=str(tmp_path))
    with pytest.raises(CheckpointError, match="needs the network"):
        make_module(checkpoint="someone/not-a-cached-model")
    bert_like = tmp_path / "bert"
    bert_like.mkdir()
    (bert_like / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="not a Chronos-T5 checkpoint"):
        make_module(checkpoint=str(bert_like))


def test_resume_checkpoint_of_another_shape_is_refused(tmp_path):
    module = make_module()
    state = {k: v.clone() for k, v in module.state_dict().items()}
    state["t5.shared.weight"] = torch.zeros(4096, 64)
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": state}, path)
    with pytest.raises(CheckpointError, match=r"t5.shared.weight: checkpoint \(4096, 64\)"):
        check_resume_checkpoint(str(path), module)
    with pytest.raises(FileNotFoundError, match="last.ckpt"):
        check_resume_checkpoint(str(tmp_path / "missing.ckpt"), module)


def test_scratch_shape_is_the_configured_t5():
    module = make_module()
    assert isinstance(module.t5, T5ForConditionalGeneration)
    assert module.t5.config.d_model == 128 and len(module.t5.encoder.block) == 2
    assert isinstance(module.chronos_config, ChronosConfig)
    assert module.chronos_config.prediction_length == HORIZON


def test_an_unknown_scratch_size_is_refused_with_the_known_ones():
    known = r"model.size='huge' is not one of model.sizes: \['mini'\]"
    with pytest.raises(ValueError, match=known):
        make_module(size="huge")


@pytest.mark.parametrize("checkpoint", ["scratch", "bundled"])
def test_loaded_model_is_in_training_mode_so_fine_tuning_uses_dropout(checkpoint):
    module = ChronosT5Module(
        checkpoint=checkpoint,
        sizes=SIZES,
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=HORIZON,
    )
    assert all(m.training for m in module.modules())
    assert module.t5.config.dropout_rate > 0


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"d_ff": 512},
            r"do not fit its config.json: \S+DenseReluDense.wi.weight has shape \(256, 128\) "
            r"in the checkpoint but \(512, 128\) in the model \(16 tensors differ\)",
        ),
        ({"num_layers": 6}, "16 weights missing"),
    ],
)
def test_weights_that_do_not_match_the_config_are_refused(tmp_path, change, message):
    target = tmp_path / "edited"
    shutil.copytree(bundled_path("chronos-t5-mini"), target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message):
        make_module(checkpoint=str(target))


@pytest.mark.parametrize("missing", ["/nonexistent/chronos", "./not/here", "~/not-here-either"])
def test_a_missing_local_directory_is_named_not_taken_for_a_hub_id(missing):
    with pytest.raises(CheckpointError, match=f"model.checkpoint='{missing}' does not exist"):
        make_module(checkpoint=missing)


def test_a_string_that_is_no_hub_id_says_so():
    with pytest.raises(CheckpointError, match="neither a local directory nor a valid hub id"):
        make_module(checkpoint="not a//valid id")


def test_a_truncated_weights_file_names_its_directory(tmp_path):
    target = tmp_path / "truncated"
    shutil.copytree(bundled_path("chronos-t5-mini"), target)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=f"weights file in {target} .*truncated or corrupt"):
        make_module(checkpoint=str(target))


def test_a_chronos_bolt_checkpoint_is_recognised(tmp_path):
    target = tmp_path / "bolt"
    shutil.copytree(bundled_path("chronos-t5-mini"), target)
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["ChronosBoltModelForForecasting"]
    config["chronos_pipeline_class"] = "ChronosBoltPipeline"
    config["chronos_config"] = {"context_length": 2048, "input_patch_size": 16}
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="is a Chronos-Bolt checkpoint.*model=chronos_bolt"):
        make_module(checkpoint=str(target))


def official_checkpoint(directory: Path, context_length: int) -> Path:
    """A tiny random Chronos-T5 saved in the official format (a T5 whose config.json carries a
    ``chronos_config``) that reads ``context_length`` steps and forecasts HORIZON."""
    shape = {**SIZES["mini"], "num_layers": 2, "num_decoder_layers": 2}
    chronos = {
        **shape.pop("chronos_config"),
        "context_length": context_length,
        "prediction_length": HORIZON,
        "num_samples": 6,
    }
    torch.manual_seed(3)
    T5ForConditionalGeneration(T5Config(**shape, chronos_config=chronos)).save_pretrained(directory)
    return directory


def test_a_context_longer_than_the_checkpoint_is_cut_to_its_last_steps(tmp_path, caplog):
    checkpoint = official_checkpoint(tmp_path / "official", context_length=CONTEXT - 8)
    with caplog.at_level("WARNING"):
        module = make_module(checkpoint=str(checkpoint))
    assert (
        f"data.context_length={CONTEXT} is longer than this Chronos-T5 checkpoint's context of "
        f"{CONTEXT - 8} steps" in caplog.text
    )
    batch = make_batch()
    earlier_steps_changed = {**batch, "context": batch["context"].clone()}
    earlier_steps_changed["context"][:, :8] = 1e4
    torch.manual_seed(0)
    expected = module.forecast(batch).samples
    torch.manual_seed(0)
    assert torch.equal(module.forecast(earlier_steps_changed).samples, expected)
    assert torch.equal(module.loss(earlier_steps_changed), module.loss(batch))
    masks = module.token_masks(batch, ["encoder.0"])
    assert masks["encoder.0"].shape == (3, CONTEXT - 8 + 1)  # the steps read + EOS


def test_generate_sampler_at_a_longer_context_gives_the_official_pipelines_samples(tmp_path):
    checkpoint = official_checkpoint(tmp_path / "official", context_length=CONTEXT - 8)
    module, batch = make_module(checkpoint=str(checkpoint), sampler="generate"), make_batch()
    pipeline = ChronosPipeline.from_pretrained(checkpoint)
    torch.manual_seed(0)
    expected = pipeline.predict(batch["context"], prediction_length=HORIZON, num_samples=6)
    torch.manual_seed(0)
    forecast = module.forecast(batch)
    assert torch.equal(forecast.samples, expected)
    levels = torch.tensor(module.quantile_levels)
    quantiles = torch.quantile(expected, levels, dim=1).permute(1, 0, 2)
    torch.testing.assert_close(forecast.quantiles, quantiles, rtol=0, atol=1e-5)


def test_export_keeps_the_loaded_checkpoints_chronos_config(tmp_path):
    loaded = json.loads((bundled_path("chronos-t5-mini") / "config.json").read_text())
    run_context = loaded["chronos_config"]["context_length"] + 16
    module = ChronosT5Module(
        checkpoint="bundled",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=run_context,
        prediction_length=48,
        num_samples=7,
    )
    module.export(str(tmp_path / "export"))
    exported = json.loads((tmp_path / "export/config.json").read_text())
    assert exported["chronos_config"] == loaded["chronos_config"]
    assert module.t5.config.chronos_config == loaded["chronos_config"]  # export changed nothing


def test_export_of_a_model_pretrained_here_records_the_runs_lengths(tmp_path):
    module = make_module()  # scratch, whose config says 512 / 64 steps
    assert SIZES["mini"]["chronos_config"]["context_length"] != CONTEXT
    module.export(str(tmp_path / "export"))
    chronos = json.loads((tmp_path / "export/config.json").read_text())["chronos_config"]
    assert (chronos["context_length"], chronos["prediction_length"]) == (CONTEXT, HORIZON)
    assert chronos["num_samples"] == 6
    pipeline = ChronosPipeline.from_pretrained(tmp_path / "export")
    assert pipeline.model.config.context_length == CONTEXT


def test_training_memory_grows_with_the_square_of_the_context_and_linearly_with_the_batch():
    def build(context: int) -> ChronosT5Module:
        return ChronosT5Module(
            checkpoint="scratch",
            sizes=SIZES,
            optimizer=partial(torch.optim.AdamW, lr=1e-3),
            context_length=context,
            prediction_length=HORIZON,
        )

    short, long = build(999), build(1999)
    weights = short.training_memory_bytes(0)
    # weights, gradients and two AdamW moments in float32
    assert (
        weights == long.training_memory_bytes(0) == 16 * sum(p.numel() for p in short.parameters())
    )
    small = short.training_memory_bytes(8) - weights
    large = long.training_memory_bytes(8) - weights
    assert 3.5 < large / small < 4.0  # the T^2 attention terms dominate
    assert short.training_memory_bytes(16) - weights == 2 * small


def test_forecast_memory_is_linear_in_the_batch_and_grows_with_the_samples():
    module = make_module()  # 6 samples
    weights = 4 * sum(p.numel() for p in module.parameters())
    one = module.forecast_memory_bytes(1) - weights
    assert one > 0 and module.forecast_memory_bytes(3) - weights == 3 * one
    fewer = module.forecast_memory_bytes(1)
    module.chronos_config = dataclasses.replace(module.chronos_config, num_samples=60)
    assert module.forecast_memory_bytes(1) > fewer


def test_attention_site_is_each_self_attention_output_before_the_residual_add():
    module, batch = make_module(), make_batch()
    attention = module.probe_layers("attention")
    assert list(attention) == [f"{s}.{i}.attn" for s in ("encoder", "decoder") for i in range(2)]
    captured: dict[str, torch.Tensor] = {}
    sublayer = module.t5.encoder.block[1].layer[0]  # T5LayerSelfAttention: x + attn(norm(x))
    handles = [
        attention["encoder.1.attn"].register_forward_hook(
            lambda _m, _a, out: captured.update(attn=out[0])
        ),
        sublayer.register_forward_pre_hook(lambda _m, args: captured.update(x=args[0])),
        sublayer.register_forward_hook(lambda _m, _a, out: captured.update(out=out[0])),
    ]
    module.probe_forward(batch)
    for handle in handles:
        handle.remove()
    # in eval mode dropout is the identity: the sub-layer's output is its input plus the probe's
    torch.testing.assert_close(captured["out"], captured["x"] + captured["attn"])
    with pytest.raises(ValueError, match="probe site must be one of"):
        module.probe_layers("mlp")


def test_token_masks_tokenise_the_batch_once_for_every_layer(monkeypatch):
    module, batch = make_module(), make_batch()
    calls = []
    transform = module.tokenizer.context_input_transform
    monkeypatch.setattr(
        module.tokenizer,
        "context_input_transform",
        lambda *a, **k: calls.append(1) or transform(*a, **k),
    )
    layers = [*module.probe_layers(), *module.probe_layers("attention")]
    masks = module.token_masks(batch, layers)
    assert set(masks) == set(layers) and len(calls) == 1
