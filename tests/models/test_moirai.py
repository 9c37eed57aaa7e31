"""Moirai wrapper: packing, masks, loss and forecasts against uni2ts' own MoiraiForecast, and
checkpoints in uni2ts' format."""

from __future__ import annotations

import builtins
import json
from functools import partial
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("uni2ts", reason="model=moirai needs the uni2ts extra")

from uni2ts.model.moirai import MoiraiForecast, MoiraiModule  # noqa: E402

from isoprobe.models.checkpoints import CheckpointError, bundled_path  # noqa: E402
from isoprobe.models.moirai.loading import INSTALL  # noqa: E402
from isoprobe.models.moirai.module import MoiraiForecastModule  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/moirai.yaml")
CONTEXT, HORIZON, PATCH = 40, 12, 8
TINY = {
    "d_model": 64,
    "num_layers": 2,
    "patch_sizes": [8, 16],
    "max_seq_len": 512,
    "attn_dropout_p": 0.0,
    "dropout_p": 0.0,
    "scaling": True,
}


def make_module(checkpoint: str = "scratch", **kwargs) -> MoiraiForecastModule:
    torch.manual_seed(0)
    options = {"patch_size": PATCH, "num_samples": 200, **kwargs}
    module = MoiraiForecastModule(
        checkpoint=checkpoint,
        sizes={"tiny": TINY},
        size="tiny",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=HORIZON,
        **options,
    )
    return module.eval()


def make_batch(batch_size: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    context = torch.randn(batch_size, CONTEXT, generator=g).cumsum(-1) + 10
    context[0, :19] = float("nan")  # left padding: two whole patches and 3 steps of the third
    context[1, 16:24] = float("nan")  # one whole patch missing inside the series
    context[2, 33] = float("nan")
    target = torch.randn(batch_size, HORIZON, generator=g) + 10
    target[1, 3] = float("nan")
    return {
        "context": context,
        "target": target,
        "loc": torch.zeros(batch_size),
        "scale": torch.ones(batch_size),
    }


def official(module: MoiraiForecastModule, num_samples: int) -> MoiraiForecast:
    return MoiraiForecast(
        prediction_length=HORIZON,
        target_dim=1,
        feat_dynamic_real_dim=0,
        past_feat_dynamic_real_dim=0,
        context_length=CONTEXT,
        module=module.module,
        patch_size=PATCH,
        num_samples=num_samples,
    ).eval()


def official_inputs(context: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """gluonts' fields: NaN imputed by 0, observed indicator, and the leading NaN as padding."""
    nan = context.isnan()
    is_pad = nan.long().cumprod(dim=1).bool()
    return context.nan_to_num(0.0).unsqueeze(-1), (~nan).unsqueeze(-1), is_pad


def test_forecast_samples_equal_uni2ts_moirai_forecast():
    module, batch = make_module(num_samples=500, sampler="official"), make_batch()
    torch.manual_seed(5)
    ours = module.forecast(batch)
    torch.manual_seed(5)
    with torch.no_grad():
        theirs = official(module, 500)(*official_inputs(batch["context"]))
    assert theirs.shape == ours.samples.shape == (3, 500, HORIZON)
    difference = (ours.samples - theirs).abs().max().item()
    assert difference < 1e-5, difference  # measured: 0.0 (identical packing, same draws)
    torch.testing.assert_close(ours.median, theirs.quantile(0.5, dim=1))


def test_the_horizon_mixture_is_the_modules_own_on_the_prediction_patches():
    """sampler=horizon samples a mixture built from the prediction patches alone: the same
    log-density and mean, value for value, as the module's mixture over the whole sequence.
    In float64: the two passes multiply matrices of other shapes, whose float32 sums differ by
    1e-4 in the log-density with two threads and not with one."""
    module, batch = make_module().double(), make_batch()
    packed = module.pack(batch["context"].double())
    with torch.no_grad():
        full = module.module(*packed.module_inputs())
        horizon = module.horizon_distribution(packed)
        values = full.sample()  # in every component's support
    ours = slice(module.context_tokens, None)
    assert horizon.batch_shape == values[:, ours].shape
    assert values.dtype == torch.float64
    exact = {"rtol": 1e-12, "atol": 1e-12}
    torch.testing.assert_close(
        horizon.log_prob(values[:, ours]), full.log_prob(values)[:, ours], **exact
    )
    torch.testing.assert_close(horizon.mean, full.mean[:, ours], **exact)


def test_the_horizon_sampler_forecasts_the_official_samplers_distribution():
    """The two samplers draw other random numbers from one distribution: with 4000 samples
    their quantiles agree to within Monte-Carlo error (a small share of the spread)."""
    batch = make_batch()
    torch.manual_seed(3)
    ours = make_module(num_samples=4000).forecast(batch)
    torch.manual_seed(3)
    theirs = make_module(num_samples=4000, sampler="official").forecast(batch)
    assert ours.samples.shape == theirs.samples.shape == (3, 4000, HORIZON)
    assert not torch.equal(ours.samples, theirs.samples)
    spread = theirs.quantiles[:, -1] - theirs.quantiles[:, 0]  # 0.9 - 0.1 quantile
    assert ((ours.quantiles - theirs.quantiles).abs() <= 0.1 * spread[:, None]).all()


def test_an_unknown_sampler_is_refused_by_name():
    with pytest.raises(ValueError, match="model.sampler must be one of"):
        make_module(sampler="fast")


def test_packing_equals_uni2ts_conversion():
    module, batch = make_module(), make_batch()
    packed = module.pack(batch["context"])
    converted = official(module, 1)._convert(PATCH, *official_inputs(batch["context"]))
    names = ("target", "observed", "sample_id", "time_id", "variate_id", "prediction")
    for name, theirs in zip(names, converted, strict=True):
        assert torch.equal(getattr(packed, name), theirs.to(getattr(packed, name).dtype)), name


def test_token_masks_are_context_patches_with_an_observed_value():
    module, batch = make_module(), make_batch()
    layers = [*module.probe_layers(), *module.probe_layers("attention")]
    masks = module.token_masks(batch, layers)
    # 40 steps at patch 8: 5 context patches, then 2 prediction ([MASK]) patches
    expected = torch.tensor(
        [
            [False, False, True, True, True, False, False],  # padding up to step 19
            [True, True, False, True, True, False, False],  # steps 16-23 missing
            [True, True, True, True, True, False, False],
        ]
    )
    assert all(torch.equal(mask, expected) for mask in masks.values())
    assert set(masks) == set(layers)
    with pytest.raises(KeyError, match="unknown Moirai layer"):
        module.token_masks(batch, ["param_proj"])


def test_loss_is_the_mean_nll_of_the_observed_horizon_per_window():
    module, batch = make_module(), make_batch()
    packed = module.pack(batch["context"], batch["target"])
    torch.manual_seed(0)
    loss = module.loss(batch)
    distribution = module.module(*packed.module_inputs())
    torch.manual_seed(0)
    nll = -distribution.log_prob(packed.target)  # [B, T, P]
    horizon = nll[:, 5:, :PATCH].reshape(3, -1)[:, :HORIZON]
    observed = ~batch["target"].isnan()
    per_window = (horizon * observed).sum(-1) / observed.sum(-1)
    torch.testing.assert_close(loss, per_window.mean())


def test_attention_site_is_the_self_attention_output_before_the_residual_add():
    module, batch = make_module(), make_batch()
    captured: dict[str, torch.Tensor] = {}
    layer = module.module.encoder.layers[1]
    handles = [
        module.probe_layers("attention")["encoder.1.attn"].register_forward_hook(
            lambda _m, _a, out: captured.update(attn=out)
        ),
        layer.register_forward_pre_hook(lambda _m, args: captured.update(x=args[0])),
        layer.ffn.register_forward_pre_hook(lambda _m, args: captured.update(normed=args[0])),
    ]
    with torch.no_grad():
        module.probe_forward(batch)
    for handle in handles:
        handle.remove()
    # pre-norm: the feed-forward reads norm2(x + attention); dropout is 0
    torch.testing.assert_close(captured["normed"], layer.norm2(captured["x"] + captured["attn"]))
    assert list(module.probe_layers()) == ["embed", "encoder.0", "encoder.1"]


def test_save_pretrained_checkpoint_loads_and_forecasts_identically(tmp_path):
    module, batch = make_module(), make_batch()
    module.module.save_pretrained(tmp_path / "official")
    loaded = make_module(checkpoint=str(tmp_path / "official"))
    assert loaded.resolved_checkpoint.kind == "path"
    torch.manual_seed(3)
    first = module.forecast(batch)
    torch.manual_seed(3)
    again = loaded.forecast(batch)
    assert torch.equal(first.quantiles, again.quantiles)
    # and our export is uni2ts' format: its own class reads it back
    module.export(str(tmp_path / "export"))
    reread = MoiraiModule.from_pretrained(tmp_path / "export")
    theirs = reread.state_dict()
    assert all(
        torch.equal(tensor, theirs[name]) for name, tensor in module.module.state_dict().items()
    )


def test_a_checkpoint_that_does_not_fit_names_the_tensor(tmp_path):
    make_module().module.save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt/config.json").read_text())
    (tmp_path / "ckpt/config.json").write_text(json.dumps({**config, "d_model": 128}))
    with pytest.raises(CheckpointError, match=r"mask_encoding.weight has shape \(1, 64\)"):
        make_module(checkpoint=str(tmp_path / "ckpt"))
    (tmp_path / "ckpt/config.json").write_text(json.dumps({**config, "num_layers": 3}))
    with pytest.raises(CheckpointError, match=r"tensors missing \(e.g. \['encoder.layers.2"):
        make_module(checkpoint=str(tmp_path / "ckpt"))
    (tmp_path / "ckpt/config.json").write_text(json.dumps({**config, "num_predict_token": 4}))
    with pytest.raises(CheckpointError, match="Moirai 2.0 checkpoint"):
        make_module(checkpoint=str(tmp_path / "ckpt"))


def test_a_patch_size_the_checkpoint_lacks_is_refused():
    with pytest.raises(ValueError, match=r"patch_size=32 is not one of .* \(8, 16\)"):
        make_module(patch_size=32)


def test_the_bundled_checkpoint_loads_and_forecasts():
    module = MoiraiForecastModule(
        checkpoint="bundled",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=HORIZON,
        num_samples=20,
    )
    assert module.resolved_checkpoint.location == str(bundled_path("moirai-mini"))
    assert module.patch_size == 32 and module.module.d_model == CONFIG.sizes.mini.d_model
    assert all(m.training for m in module.modules())  # fine-tuning runs in training mode
    forecast = module.eval().forecast(make_batch())
    assert torch.isfinite(forecast.quantiles).all()


def test_without_uni2ts_the_error_names_the_install_command(monkeypatch):
    real_import = builtins.__import__

    def no_uni2ts(name, *args, **kwargs):
        if name.startswith("uni2ts"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uni2ts)
    with pytest.raises(ImportError, match=r"pip install --no-deps uni2ts==2\.0\.0"):
        make_module()
    assert "jaxtyping" in INSTALL


def test_memory_estimates_grow_with_the_batch():
    module = make_module()
    weights = 16 * sum(p.numel() for p in module.parameters())
    assert module.training_memory_bytes(0) == weights
    step = module.training_memory_bytes(1) - weights
    assert step > 0 and module.training_memory_bytes(4) - weights == 4 * step
    fewer = module.forecast_memory_bytes(2)
    module.num_samples *= 10
    assert module.forecast_memory_bytes(2) > fewer


def test_the_install_command_names_the_pins_that_setup_installs():
    listed = (ROOT / "scripts" / "moirai-requirements.txt").read_text().splitlines()
    pins = [line for line in listed if line and not line.startswith("#")]
    assert INSTALL.split("--no-deps ")[1].split() == pins
