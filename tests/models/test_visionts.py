"""VisionTS (isoprobe.models.visionts.module): forecasts equal to the official ``visionts``
package's on the same weights (tests/fixtures/visionts, made by its make_fixture.py), the image
layout the official ``update_config`` computes, the published files' checks and the checkpoint
choices."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import isoprobe.models.visionts.checkpoint as visionts_weights
import isoprobe.models.visionts.module as visionts_module
from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.compression import compress_attention
from isoprobe.models.visionts.image import ImageLayout, normalise, render
from isoprobe.models.visionts.mae import MAEShape, from_published, to_published
from isoprobe.models.visionts.module import VisionTSModule

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "visionts"
SHAPE = json.loads((FIXTURE / "mae_tiny.json").read_text())
#: float32 through an MAE and two resizes, summed in another order (split q/k/v): the
#: forecasts agree to this, in the series' units (values up to ~60; measured: 3.8e-6)
PARITY_ATOL = 2e-5


def published_state() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURE / "mae_tiny.safetensors"))


def write_pth(path: Path, state: dict[str, torch.Tensor]) -> Path:
    torch.save({"model": state}, path)
    return path


def build(checkpoint: str, context: int, horizon: int, period: int | None, **kwargs):
    return VisionTSModule(
        checkpoint=checkpoint,
        periodicity=period,
        size="fixture",
        sizes={"fixture": SHAPE},
        optimizer=torch.optim.AdamW,
        context_length=context,
        prediction_length=horizon,
        **kwargs,
    ).eval()


def forecast(model: VisionTSModule, context: torch.Tensor) -> torch.Tensor:
    batch = {
        "context": context,
        "target": torch.zeros(context.shape[0], model.prediction_length),
        "loc": torch.zeros(context.shape[0]),
        "scale": torch.ones(context.shape[0]),
    }
    return model.forecast(batch).median


def test_forecasts_equal_the_official_package_on_the_same_weights(tmp_path):
    arrays = np.load(FIXTURE / "forecasts.npz")
    pth = write_pth(tmp_path / "mae_visualize_vit_tiny.pth", published_state())
    cases = sorted(k for k in arrays.files if k.startswith("case_"))
    assert len(cases) == 3
    worst = []
    for key in cases:
        i = key.removeprefix("case_")
        context, horizon, period = (int(v) for v in arrays[key])
        model = build(str(pth), context, horizon, period)
        ours = forecast(model, torch.from_numpy(arrays[f"context_{i}"]))
        official = torch.from_numpy(arrays[f"forecast_{i}"])
        assert ours.shape == official.shape
        worst.append(float((ours - official).abs().max()))
    print(f"largest |isoprobe - official| per case (context, horizon, period): {worst}")
    assert max(worst) < PARITY_ATOL, worst


def test_the_rendered_image_is_the_official_one():
    """The visible part of the MAE's input, rendered with F.interpolate, against the official
    torchvision ``Resize(antialias=False)`` render (its hidden patches shown as -2)."""
    arrays = np.load(FIXTURE / "forecasts.npz")
    for i in range(3):
        context, horizon, period = (int(v) for v in arrays[f"case_{i}"])
        layout = ImageLayout(SHAPE["image_size"], SHAPE["patch_size"], context, horizon, period)
        values, _, _ = normalise(torch.from_numpy(arrays[f"context_{i}"]))
        ours = render(values, layout)
        official = torch.from_numpy(arrays[f"image_{i}"])
        width = layout.visible_width
        assert (official[..., width:] == -2).all()
        torch.testing.assert_close(ours[:, 0, :, :width], official[..., :width], rtol=0, atol=1e-6)


def test_the_layout_is_the_official_update_config_s():
    """224-pixel image, 16-pixel patches (the published base): context 96, horizon 24, period 24
    gives 4 periods in 4 visible patch columns (int(96/120 x 14 x 0.4) = 4) of 64 pixels, read
    back over round(224 x 4 / 64) = 14 periods; context 100, period 7 pads 5 steps left."""
    even = ImageLayout(224, 16, 96, 24, 24)
    assert (even.pad_left, even.pad_right, even.context_periods) == (0, 0, 4)
    assert (even.visible_columns, even.visible_width, even.output_periods) == (4, 64, 14)
    padded = ImageLayout(224, 16, 100, 30, 7)
    assert (padded.pad_left, padded.pad_right, padded.context_periods) == (5, 5, 15)
    assert padded.visible_columns == int(105 / 140 * 14 * 0.4) == 4
    assert padded.output_periods == round(224 * 15 / 64) == 52


def test_the_image_is_the_context_by_period_then_zeros():
    """Context 16 at period 4, horizon 16, a 16-pixel image of 4-pixel patches: 2 visible
    columns (int(0.5 x 4 x 1.0)), so the 4 x 4 grid (phase f, period n: step 4n + f) is
    resized to 16 x 8 pixels by bilinear interpolation (align_corners=False), the right half
    zeros, the three channels equal."""
    layout = ImageLayout(16, 4, 16, 16, 4, align_const=1.0)
    assert layout.visible_columns == 2 and layout.visible_width == 8
    image = render(torch.arange(16.0).unsqueeze(0), layout)
    assert image.shape == (1, 3, 16, 16)
    assert torch.equal(image[:, 0], image[:, 1]) and torch.equal(image[:, 0], image[:, 2])
    assert (image[..., 8:] == 0).all()
    assert image[0, 0, 0, 0] == 0.0 and image[0, 0, 15, 7] == 15.0  # the corners: steps 0, 15
    # pixel (2, 1) sits at grid (0.125, 0.25): phase 0.125 + 4 x period 0.25
    assert image[0, 0, 2, 1] == 1.125


def test_normalisation_uses_the_observed_steps_and_puts_missing_ones_at_the_mean():
    context = torch.tensor([[float("nan"), 1.0, 3.0, float("nan"), 5.0]])
    values, mean, scale = normalise(context)
    assert mean.item() == 3.0
    torch.testing.assert_close(scale, torch.tensor([[((8 / 3 + 1e-5) ** 0.5) / 0.4]]))
    assert values[0, 0] == 0 and values[0, 3] == 0 and values[0, 2] == 0
    torch.testing.assert_close(values[0, 4], 2.0 / scale[0, 0])


def context_stds(context: torch.Tensor) -> list[float]:
    """Each window's population standard deviation of its observed context values, with
    VisionTS's 1e-5 under the root."""
    return [float(np.sqrt(np.var(row[~np.isnan(row)]) + 1e-5)) for row in context.double().numpy()]


def test_the_loss_is_the_forecast_s_mse_over_the_observed_target_steps_in_context_stds():
    """The objective on windows with gaps in the context and the target, computed apart from
    the module: each observed target step's error, the forecast less the target in units of its
    window's context standard deviation, squared, averaged over all observed steps of the batch
    (a missing step counts nothing, not a zero)."""
    model = build("scratch", 24, 6, 4)
    g = torch.Generator().manual_seed(2)
    context = torch.randn(2, 24, generator=g).cumsum(-1) * 3 + 40
    context[0, :8] = float("nan")  # left padding
    context[1, 10:13] = float("nan")  # a gap
    target = torch.randn(2, 6, generator=g) * 3 + 40
    target[0, 2] = target[1, 4:] = float("nan")
    batch = {"context": context, "target": target, "loc": torch.zeros(2), "scale": torch.ones(2)}
    point = model.forecast(batch).median.double().numpy()
    errors = [
        ((p - t) / std) ** 2
        for p_row, t_row, std in zip(
            point, target.double().numpy(), context_stds(context), strict=True
        )
        for p, t in zip(p_row, t_row, strict=True)
        if not np.isnan(t)
    ]
    assert len(errors) == 9
    with torch.no_grad():
        loss = model.loss(batch)
    torch.testing.assert_close(loss.double(), torch.tensor(np.mean(errors)), rtol=1e-5, atol=0)


def test_qkv_split_and_fused_again_is_the_published_state_dict():
    state = published_state()
    here = from_published(state)
    assert "blocks.0.attn.qkv.weight" not in here and "encoder_input.cls_token" in here
    width = SHAPE["width"]
    assert torch.equal(
        here["blocks.1.attn.k.weight"], state["blocks.1.attn.qkv.weight"][width:-width]
    )
    again = to_published(here)
    assert set(again) == set(state) and all(torch.equal(again[k], state[k]) for k in state)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda s: s.pop("decoder_pred.bias"), r"1 missing: decoder_pred\.bias"),
        (
            lambda s: s.update({"blocks.0.attn.qkv.weight": torch.zeros(32, 32)}),
            r"1 misshapen: blocks\.0\.attn\.qkv\.weight \(32, 32\) \(expected \(96, 32\)\)",
        ),
        (lambda s: s.update({"head.weight": torch.zeros(2)}), r"1 unexpected: head\.weight"),
    ],
)
def test_a_pth_with_missing_misshapen_or_extra_tensors_is_refused_naming_them(
    tmp_path, change, named
):
    state = published_state()
    change(state)
    pth = write_pth(tmp_path / "mae.pth", state)
    with pytest.raises(CheckpointError, match=rf"{pth} does not fit the VisionTS MAE .*{named}"):
        build(str(pth), 96, 24, 24)


def test_a_pth_without_the_model_key_is_refused(tmp_path):
    path = tmp_path / "mae.pth"
    torch.save(published_state(), path)
    with pytest.raises(CheckpointError, match=r"must hold \{'model': state_dict\}"):
        build(str(path), 96, 24, 24)


def test_official_offline_and_not_cached_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(visionts_weights, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(visionts_weights, "host_reachable", lambda host: False)
    with pytest.raises(CheckpointError, match=r"mae_visualize_vit_base\.pth, and .* unreachable"):
        VisionTSModule(checkpoint="official", size="base", optimizer=torch.optim.AdamW)
    with pytest.raises(CheckpointError, match=r"not model.size='mini'"):
        VisionTSModule(checkpoint="official", size="mini", optimizer=torch.optim.AdamW)


def test_official_reads_the_cached_published_file(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir()
    write_pth(cache / "mae_visualize_vit_base.pth", published_state())
    monkeypatch.setattr(visionts_weights, "CACHE_DIR", cache)
    monkeypatch.setattr(
        visionts_weights, "OFFICIAL_FILES", {"fixture": "mae_visualize_vit_base.pth"}
    )
    monkeypatch.setattr(
        visionts_module, "OFFICIAL_FILES", {"fixture": "mae_visualize_vit_base.pth"}
    )
    model = build("official", 96, 24, 24)
    assert model.resolved_checkpoint.kind == "hub"
    assert torch.equal(model.mae.decoder_pred.bias, published_state()["decoder_pred.bias"])


def test_auto_offline_is_the_error_of_a_model_that_ships_no_weights(monkeypatch):
    monkeypatch.setattr(visionts_module, "host_reachable", lambda host: False)
    with pytest.raises(CheckpointError, match=r"ships no checkpoint 'visionts-mini'.*scratch"):
        VisionTSModule(checkpoint="auto", optimizer=torch.optim.AdamW)


def test_the_period_is_the_data_s_season_unless_set():
    model = build("scratch", 96, 24, None, season_length=24)
    assert model.layout.periodicity == 24
    assert build("scratch", 96, 24, 12, season_length=24).layout.periodicity == 12
    with pytest.raises(ValueError, match=r"period must be .* >= 1, got 0: set model.periodicity"):
        build("scratch", 96, 24, 0)


def test_a_horizon_the_image_cannot_hold_is_refused():
    with pytest.raises(ValueError, match=r"image holds .* steps .* need"):
        build("scratch", 16, 400, 1)


def test_compression_truncates_the_published_fused_qkv_through_its_parts(tmp_path):
    """The published fused ``qkv`` is three layers here: compression replaces each (none is left
    as ``fused``), and the rank-r query is what the block then applies."""
    pth = write_pth(tmp_path / "mae.pth", published_state())
    model = build(str(pth), 96, 24, 24)
    reports = compress_attention(model, eps=0.5)
    assert {r.status for r in reports} <= {"factored", "truncated"}
    assert {r.projection for r in reports} == {"q", "k", "v", "o"}
    q = model.attention_weights()["encoder.0"]["q"]
    assert torch.linalg.matrix_rank(q.detach()) < SHAPE["width"]


def test_export_is_the_published_layout(tmp_path):
    pth = write_pth(tmp_path / "mae.pth", published_state())
    model = build(str(pth), 96, 24, 24)
    model.export(str(tmp_path / "export"))
    saved = torch.load(tmp_path / "export" / "model.pth", weights_only=True)
    state = published_state()
    assert set(saved) == {"model"} and set(saved["model"]) == set(state)
    assert all(torch.equal(saved["model"][k], state[k]) for k in state)
    assert (
        MAEShape(**SHAPE).as_dict().items()
        <= json.loads((tmp_path / "export" / "config.json").read_text()).items()
    )
