"""PatchTST wrapper against transformers' PatchTSTForPrediction and independent computations:
forecasts, loss, token masks, probe sites and official-format checkpoints."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from transformers import PatchTSTConfig, PatchTSTForPrediction

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.patchtst import PatchTSTModule

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/patchtst.yaml")
CONTEXT, HORIZON, PATCH, STRIDE = 40, 6, 16, 8  # 40 steps: 4 patches, the first 0 steps cut


def make_module(checkpoint: str = "scratch", horizon: int = HORIZON, **kwargs) -> PatchTSTModule:
    torch.manual_seed(0)
    sizes = OmegaConf.to_container(CONFIG.sizes)
    sizes["paper"].update(d_model=16, ffn_dim=32)
    module = PatchTSTModule(
        checkpoint=checkpoint,
        sizes=sizes,
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=horizon,
        **kwargs,
    )
    return module.eval()


def official_checkpoint(directory: Path, channels: int = 1, **fields) -> Path:
    """A random PatchTSTForPrediction saved with the official class."""
    config = PatchTSTConfig(
        num_input_channels=channels,
        context_length=CONTEXT,
        prediction_length=HORIZON,
        patch_length=PATCH,
        patch_stride=STRIDE,
        d_model=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=32,
        pooling_type=None,
        **fields,
    )
    torch.manual_seed(1)
    PatchTSTForPrediction(config).save_pretrained(directory)
    return directory


def make_batch(missing: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    context = torch.randn(4, CONTEXT, generator=g).cumsum(-1) * 3 + 50
    target = torch.randn(4, HORIZON, generator=g) * 3 + 50
    if missing:
        context[0, :20] = float("nan")  # left padding
        context[1, 25:28] = float("nan")  # missing values inside
    return {"context": context, "target": target, "loc": torch.zeros(4), "scale": torch.ones(4)}


def official_forward(model: PatchTSTForPrediction, context: torch.Tensor):
    """The official forward, NaNs filled with the window's observed mean and masked."""
    observed = ~context.isnan()
    mean = torch.stack([row[~row.isnan()].mean() for row in context]).unsqueeze(1)
    values = torch.where(observed, context, mean)
    return model(
        past_values=values.unsqueeze(-1), past_observed_mask=observed.unsqueeze(-1).float()
    )


@pytest.mark.parametrize("missing", [False, True])
def test_forecasts_equal_the_official_forward(tmp_path, missing):
    checkpoint = official_checkpoint(tmp_path / "official")
    module, batch = make_module(str(checkpoint)), make_batch(missing)
    official = PatchTSTForPrediction.from_pretrained(checkpoint).eval()
    with torch.no_grad():
        if missing:
            expected = official_forward(official, batch["context"]).prediction_outputs[..., 0]
        else:  # the plain official call
            expected = official(past_values=batch["context"].unsqueeze(-1)).prediction_outputs
            expected = expected[..., 0]
    forecast = module.forecast(batch)
    assert (forecast.median - expected).abs().max() < 1e-5  # float rounding (inference kernels)
    # a point forecast: every quantile level is the point
    assert torch.equal(
        forecast.quantiles, forecast.median.unsqueeze(1).expand_as(forecast.quantiles)
    )


def test_missing_values_do_not_move_the_scaler():
    """The scaler reads observed values only, and the filled values are 0 after it."""
    module = make_module()
    batch = make_batch()
    values, observed = module._inputs(batch["context"])
    scaled, loc, scale = module.model.model.scaler(values, observed)
    row = batch["context"][0, 20:]
    torch.testing.assert_close(loc[0, 0, 0], row.mean())
    assert torch.equal(scaled[0, :20, 0], torch.zeros(20))


def test_an_official_checkpoint_loads_with_its_weights_and_exports_the_same(tmp_path):
    checkpoint = official_checkpoint(tmp_path / "official")
    module = make_module(str(checkpoint))
    assert module.resolved_checkpoint.kind == "path"
    official = PatchTSTForPrediction.from_pretrained(checkpoint).state_dict()
    ours = module.model.state_dict()
    assert official.keys() == ours.keys()
    assert all(torch.equal(v, ours[k]) for k, v in official.items())
    module.export(str(tmp_path / "export"))
    again = PatchTSTForPrediction.from_pretrained(tmp_path / "export").state_dict()
    assert all(torch.equal(v, again[k]) for k, v in official.items())


def test_a_shared_weight_multichannel_checkpoint_reads_one_channel(tmp_path):
    checkpoint = official_checkpoint(tmp_path / "etth1", channels=7)
    module, batch = make_module(str(checkpoint)), make_batch(missing=False)
    official = PatchTSTForPrediction.from_pretrained(checkpoint).eval()
    context = batch["context"].unsqueeze(-1).expand(-1, -1, 7)
    with torch.no_grad():
        expected = official(past_values=context).prediction_outputs[..., 3]
    assert (module.forecast(batch).median - expected).abs().max() < 1e-5


@pytest.mark.parametrize("field, value", [("context_length", 48), ("prediction_length", 12)])
def test_a_checkpoint_for_other_lengths_names_the_mismatch(tmp_path, field, value):
    checkpoint = official_checkpoint(tmp_path / "official")
    lengths = {"context_length": CONTEXT, "prediction_length": HORIZON, field: value}
    torch.manual_seed(0)
    with pytest.raises(CheckpointError, match=f"data.{field}={value}"):
        PatchTSTModule(checkpoint=str(checkpoint), optimizer=partial(torch.optim.AdamW), **lengths)


def test_a_tensor_of_another_shape_is_named(tmp_path):
    checkpoint = official_checkpoint(tmp_path / "official")
    tensors = load_file(checkpoint / "model.safetensors")
    tensors["head.projection.bias"] = torch.zeros(5)
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"head.projection.bias has shape \(5,\)"):
        make_module(str(checkpoint))


def test_a_head_of_another_loss_is_refused(tmp_path):
    checkpoint = official_checkpoint(tmp_path / "official")
    with pytest.raises(CheckpointError, match="model.loss=mse"):
        make_module(str(checkpoint), loss="nll")


def test_mse_loss_equals_the_official_loss_and_skips_missing_targets():
    module, batch = make_module(), make_batch(missing=False)
    values = batch["context"].unsqueeze(-1)
    official = module.model(past_values=values, future_values=batch["target"].unsqueeze(-1))
    torch.testing.assert_close(module.loss(batch), official.loss)
    prediction = official.prediction_outputs[..., 0]
    batch["target"][2, 1] = float("nan")
    keep = ~batch["target"].isnan()
    expected = (prediction - batch["target"])[keep].square().mean()
    torch.testing.assert_close(module.loss(batch), expected)


@pytest.mark.parametrize("distribution", ["student_t", "normal"])
def test_nll_loss_and_sampled_quantiles(distribution):
    module = make_module(loss="nll", distribution_output=distribution, num_samples=2000)
    batch = make_batch(missing=False)
    values = batch["context"].unsqueeze(-1)
    official = module.model(past_values=values, future_values=batch["target"].unsqueeze(-1))
    torch.testing.assert_close(module.loss(batch), official.loss)
    torch.manual_seed(0)
    forecast = module.forecast(batch)
    assert forecast.samples.shape == (4, 2000, HORIZON)
    assert (forecast.quantiles.diff(dim=1) >= 0).all()
    if distribution == "normal":  # against the exact quantiles of the head's distribution
        output = module.model(past_values=values)
        head = module._distribution(output)
        mean, std = head.mean[..., 0], head.stddev[..., 0]
        exact = mean + std * torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(0.9))
        assert ((forecast.quantiles[:, -1] - exact).abs() / std).max() < 0.15


def test_token_masks_are_the_patches_with_observed_values():
    module = make_module()
    context = torch.ones(3, CONTEXT)  # patches start at 0, 8, 16, 24
    context[0, :16] = float("nan")  # patch 0 missing; patch 1 (8..23) half observed
    context[1, :24] = float("nan")  # patches 0 and 1 missing
    context[2, 20:22] = float("nan")  # observed around them
    batch = {"context": context, "target": torch.ones(3, HORIZON)}
    masks = module.token_masks(batch, ["embed", "encoder.1", "encoder.0.attn"])
    patches = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(masks["embed"], patches.unsqueeze(1))  # [B, C, P]
    assert torch.equal(masks["encoder.1"], patches.unsqueeze(1))
    assert torch.equal(masks["encoder.0.attn"], patches)  # [B C, P]
    with pytest.raises(KeyError, match="unknown PatchTST layer"):
        module.token_masks(batch, ["head"])


def test_probe_sites_are_the_embedding_the_layers_and_attention_before_the_residual():
    module, batch = make_module(), make_batch()
    assert list(module.probe_layers()) == ["embed", "encoder.0", "encoder.1"]
    attention = module.probe_layers("attention")
    assert list(attention) == ["encoder.0.attn", "encoder.1.attn"]
    layer = module.model.model.encoder.layers[1]
    captured: dict[str, torch.Tensor] = {}
    handles = [
        attention["encoder.1.attn"].register_forward_hook(
            lambda _m, _a, out: captured.update(attn=out[0])
        ),
        layer.register_forward_pre_hook(
            lambda _m, _a, kw: captured.update(x=kw["hidden_state"]), with_kwargs=True
        ),
        layer.norm_sublayer1.register_forward_hook(lambda _m, _a, out: captured.update(n=out)),
    ]
    with torch.no_grad():
        module.probe_forward(batch)
    for handle in handles:
        handle.remove()
    assert captured["x"].shape == (4, 1, 4, 16)
    assert captured["attn"].shape == (4, 4, 16)
    # pre-norm: the sub-layer reads norm(x); its out_proj output is what the residual adds
    expected = layer.self_attn(captured["n"])[0]
    torch.testing.assert_close(captured["attn"], expected)
    weights = module.attention_weights()["encoder.1"]
    assert weights["o"] is layer.self_attn.out_proj.weight
    assert weights["q"] is layer.self_attn.q_proj.weight


def test_the_paper_size_uses_patch_stride_8():
    module = make_module()
    config = module.model.config
    assert (config.patch_length, config.patch_stride) == (16, 8)
    assert module.model.model.patchifier.num_patches == (CONTEXT - PATCH) // STRIDE + 1


def test_the_bundled_checkpoint_loads_for_its_window_and_names_another():
    optimizer = partial(torch.optim.AdamW)
    module = PatchTSTModule(
        checkpoint="bundled", optimizer=optimizer, context_length=512, prediction_length=64
    ).eval()
    assert module.model.config.patch_stride == 8
    context = torch.sin(torch.arange(512.0) / 8).repeat(2, 1)
    forecast = module.forecast({"context": context, "target": torch.zeros(2, 64)})
    assert torch.isfinite(forecast.median).all()
    with pytest.raises(CheckpointError, match="data.context_length=256"):
        PatchTSTModule(
            checkpoint="bundled", optimizer=optimizer, context_length=256, prediction_length=64
        )
