"""Chronos-2 wrapper: forecasts against Chronos2Pipeline, loss, masks and official checkpoints."""

from __future__ import annotations

import builtins
import copy
import importlib
import json
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from chronos.chronos2 import Chronos2CoreConfig, Chronos2Model, Chronos2Pipeline
from chronos.chronos2.layers import GroupSelfAttention
from chronos.chronos2.model import Chronos2Encoder
from omegaconf import OmegaConf

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.chronos.chronos2 import CHRONOS2_FIELDS, Chronos2Module
from isoprobe.models.chronos.chronos2_group_attention import (
    OwnGroupSelfAttention,
    skip_own_group_attention,
)

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/chronos2.yaml")
CONTEXT, HORIZON, PATCH = 40, 24, 8
#: the largest |isoprobe - Chronos2Pipeline| over quantiles and median, on float32 CPU
PARITY_TOLERANCE = 1e-5
GRID = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
#: quantile head values (standardised scale) per level that cross: q0.1 above q0.9, the 0.5
#: head not the median of the nine
CROSSED = [torch.linspace(-2, 2, len(GRID))[i].item() for i in (8, 0, 5, 2, 7, 4, 1, 6, 3)]


def tiny_fields(**change) -> dict:
    """A tiny Chronos-2 shape: 8-step patches, 2 blocks, quantile levels 0.1 .. 0.9."""
    fields = {
        **OmegaConf.to_container(CONFIG.sizes.mini),
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 64,
        "num_layers": 2,
        **change,
    }
    fields["chronos_config"] = {
        **fields["chronos_config"],
        "context_length": 32,
        "input_patch_size": PATCH,
        "input_patch_stride": PATCH,
        "output_patch_size": PATCH,
        "max_output_patches": 4,
        "quantiles": GRID,
    }
    return fields


def make_module(
    checkpoint: str = "scratch",
    levels: tuple[float, ...] = (0.1, 0.3, 0.5, 0.9),
    sort_quantiles: bool = True,
    **fields,
) -> Chronos2Module:
    torch.manual_seed(0)
    module = Chronos2Module(
        checkpoint=checkpoint,
        sizes={"tiny": tiny_fields(**fields)},
        size="tiny",
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=HORIZON,
        quantile_levels=levels,
        sort_quantiles=sort_quantiles,
    )
    return module.eval()


def cross_heads(model: Chronos2Model) -> None:
    """Make the quantile head emit nearly CROSSED per level at every step (its weights shrunk,
    its bias set; the head's outputs are level-major within an output patch)."""
    head = model.output_patch_embedding
    with torch.no_grad():
        head.output_layer.weight.mul_(0.01)
        head.residual_layer.weight.mul_(0.01)
        head.residual_layer.bias.copy_(torch.tensor(CROSSED).repeat_interleave(PATCH))


def make_batch(batch_size: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    context = torch.randn(batch_size, CONTEXT, generator=g).cumsum(-1) + 10
    context[0, :20] = float("nan")  # leading NaNs: in the read window, patch 0 all-missing
    context[1, 30] = float("nan")  # one missing value inside a patch
    target = torch.randn(batch_size, HORIZON, generator=g) + 10
    target[2, 5] = float("nan")
    return {
        "context": context,
        "target": target,
        "loc": torch.zeros(batch_size),
        "scale": torch.ones(batch_size),
    }


def test_forecasts_equal_the_official_pipeline_on_the_same_weights():
    module, batch = make_module(), make_batch()
    assert CONTEXT > module.model.chronos_config.context_length  # both keep the last 32 steps
    pipeline = Chronos2Pipeline(module.model)
    levels = list(module.quantile_levels)
    quantiles, _ = pipeline.predict_quantiles(
        [c for c in batch["context"]], prediction_length=HORIZON, quantile_levels=levels
    )
    official = torch.stack([q[0] for q in quantiles]).transpose(1, 2)  # [B, Q, H]
    # the pipeline uses its quantile heads as they are (its point forecast is the 0.5 head);
    # isoprobe sorts them first, so the comparison is on the pipeline's heads, sorted
    raw = torch.stack(pipeline.predict([c for c in batch["context"]], prediction_length=HORIZON))
    grid = pipeline.quantiles
    rows = [grid.index(q) for q in levels]
    ours = module.forecast(batch)
    assert ours.quantiles.shape == official.shape
    sorted_raw = raw[:, 0].sort(dim=1).values
    diff = max(
        (ours.quantiles - sorted_raw[:, rows]).abs().max().item(),
        (ours.median - sorted_raw[:, grid.index(0.5)]).abs().max().item(),
    )
    print(f"Chronos-2 parity: max |isoprobe - Chronos2Pipeline| = {diff:.3g}")
    assert diff < PARITY_TOLERANCE, diff
    # where the heads do not cross, sorting changes nothing: the pipeline's own quantiles
    uncrossed = (raw[:, 0].diff(dim=1) >= 0).all(dim=1)  # [B, H]
    gap = (ours.quantiles - official).abs().amax(dim=1)[uncrossed]
    assert gap.numel() == 0 or gap.max() < PARITY_TOLERANCE


@pytest.mark.parametrize(
    "levels",
    [
        (0.1, 0.3, 0.5, 0.9),  # the model's own: the pipeline returns its heads as they are
        (0.05, 0.25, 0.5, 0.75, 0.95),  # interpolated between them, flat beyond
    ],
)
def test_unsorted_quantiles_equal_the_official_pipeline_where_heads_cross(levels):
    module = make_module(levels=levels, sort_quantiles=False)
    cross_heads(module.model)
    batch = make_batch()
    pipeline = Chronos2Pipeline(module.model)
    contexts = list(batch["context"])
    raw = torch.stack(pipeline.predict(contexts, prediction_length=HORIZON))[:, 0]
    assert (raw[:, 0] > raw[:, -1]).all()  # q0.1 above q0.9 at every step
    quantiles, median = pipeline.predict_quantiles(
        contexts, prediction_length=HORIZON, quantile_levels=list(levels)
    )
    expected = torch.stack([q[0] for q in quantiles]).transpose(1, 2)  # [B, Q, H]
    forecast = module.forecast(batch)
    torch.testing.assert_close(forecast.quantiles, expected, rtol=0, atol=PARITY_TOLERANCE)
    torch.testing.assert_close(
        forecast.median, torch.stack([m[0] for m in median]), rtol=0, atol=PARITY_TOLERANCE
    )
    ordered = make_module(levels=levels)
    cross_heads(ordered.model)
    sorted_quantiles = ordered.forecast(batch).quantiles
    assert (sorted_quantiles.diff(dim=1) >= 0).all()  # the default: quantiles that do not cross
    assert (sorted_quantiles - forecast.quantiles).abs().max() > 1.0


def test_loss_equals_an_independent_quantile_loss():
    module, batch = make_module(), make_batch()
    model = module.model
    context = batch["context"][:, -32:]
    preds = model(context=context, num_output_patches=3).quantile_preds  # data scale
    # the model's scaling: mean and std of the observed context, then arcsinh
    mask = ~context.isnan()
    n = mask.sum(-1, keepdim=True)
    loc = context.nan_to_num().sum(-1, keepdim=True) / n
    var = ((context - loc).nan_to_num() ** 2).sum(-1, keepdim=True) / n
    scale = var.sqrt()
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)

    def norm(x):
        return torch.arcsinh((x - loc) / scale)

    y = norm(batch["target"]).unsqueeze(1)
    q = torch.arcsinh((preds - loc.unsqueeze(1)) / scale.unsqueeze(1))
    levels = torch.tensor(GRID).view(1, -1, 1)
    pinball = 2 * ((y - q) * ((y <= q).float() - levels)).abs()
    pinball = pinball.nan_to_num(0.0)  # the missing target value counts zero
    expected = pinball.mean(-1).sum(-1).mean()
    torch.testing.assert_close(module.loss(batch), expected, rtol=1e-4, atol=1e-4)


def test_token_masks_keep_observed_context_patches_only():
    module, batch = make_module(), make_batch()
    layers = [*module.probe_layers(), *module.probe_layers("attention")]
    masks = module.token_masks(batch, layers)
    # 32 steps read = 4 patches of 8; + REG + 3 placeholders (24 steps)
    expected = torch.tensor(
        [
            [False, True, True, True, False, False, False, False],  # steps 8..19 of the
            [True, True, True, True, False, False, False, False],  # read window are NaN
            [True, True, True, True, False, False, False, False],
        ]
    )
    assert all(torch.equal(m, expected) for m in masks.values())
    with pytest.raises(KeyError, match="unknown Chronos-2 layer"):
        module.token_masks(batch, ["head"])


def first(output) -> torch.Tensor:
    """A hooked module's representation: the tensor, or the first element of its output."""
    return output if isinstance(output, torch.Tensor) else output[0]


def test_probe_layers_capture_every_block_once_with_the_masks_shape():
    module, batch = make_module(), make_batch()
    for site in ("block", "attention"):
        layers = module.probe_layers(site)
        captured: dict[str, list] = {n: [] for n in layers}
        hooks = [
            m.register_forward_hook(lambda _m, _i, out, n=n, c=captured: c[n].append(first(out)))
            for n, m in layers.items()
        ]
        with torch.no_grad():
            module.probe_forward(batch)
        for h in hooks:
            h.remove()
        assert all(len(v) == 1 for v in captured.values())
        assert all(v[0].shape == (3, 8, 32) for v in captured.values())
    assert list(module.probe_layers()) == ["embed", "encoder.0", "encoder.1"]
    assert list(module.probe_layers("attention")) == ["encoder.0.attn", "encoder.1.attn"]


def test_attention_site_is_the_time_attention_before_the_residual_add():
    module, batch = make_module(), make_batch()
    sublayer = module.model.encoder.block[1].layer[0]  # TimeSelfAttention: x + attn(norm(x))
    captured = {}
    handles = [
        module.probe_layers("attention")["encoder.1.attn"].register_forward_hook(
            lambda _m, _a, out: captured.update(attn=out)
        ),
        sublayer.register_forward_pre_hook(lambda _m, args: captured.update(x=args[0])),
        sublayer.register_forward_hook(lambda _m, _a, out: captured.update(out=out[0])),
    ]
    module.probe_forward(batch)
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(captured["out"], captured["x"] + captured["attn"])


def test_windows_do_not_mix_across_the_batch():
    module, batch = make_module(), make_batch()
    alone = module.forecast({k: v[:1] for k, v in batch.items()})
    together = module.forecast(batch)
    torch.testing.assert_close(alone.quantiles, together.quantiles[:1])


def group_attention_pair() -> tuple[GroupSelfAttention, OwnGroupSelfAttention]:
    """The official group attention of the tiny shape, seeded, and a copy made isoprobe's."""
    torch.manual_seed(2)
    config = Chronos2CoreConfig(**CHRONOS2_FIELDS, **tiny_fields())
    official = GroupSelfAttention(config).eval()
    own = copy.deepcopy(official)
    skip_own_group_attention(own)
    assert type(own) is OwnGroupSelfAttention
    return official, own


def group_time_mask(group_ids: list[int], observed: torch.Tensor) -> torch.Tensor:
    """The model's own additive [T, 1, B, B] mask for these groups and observed positions."""
    return Chronos2Encoder._construct_and_invert_group_time_mask(
        torch.tensor(group_ids), observed.float(), torch.float32
    )


def test_own_group_attention_is_the_official_one_bit_for_bit_where_windows_are_alone():
    """Every window its own group: the value where the window observes the position, the
    batch's mean value where it does not, exactly as the softmax of the official module."""
    official, own = group_attention_pair()
    hidden = torch.randn(5, 6, 32)
    observed = torch.ones(5, 6)
    observed[0, :3] = 0  # leading padding
    observed[3, 4] = 0
    mask = group_time_mask([0, 1, 2, 3, 4], observed)
    expected = official(hidden, mask).hidden_states
    assert torch.equal(own(hidden, mask).hidden_states[observed.bool()], expected[observed.bool()])
    torch.testing.assert_close(own(hidden, mask).hidden_states, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("case", ["shared group", "training", "attention weights"])
def test_own_group_attention_runs_the_official_forward_where_it_cannot_skip(case):
    official, own = group_attention_pair()
    hidden, observed = torch.randn(5, 6, 32), torch.ones(5, 6)
    groups = [0, 0, 1, 2, 2] if case == "shared group" else [0, 1, 2, 3, 4]
    mask = group_time_mask(groups, observed)
    if case == "training":
        official.train(), own.train()
    weights = case == "attention weights"
    torch.manual_seed(3)
    expected = official(hidden, mask, output_attentions=weights)
    torch.manual_seed(3)
    got = own(hidden, mask, output_attentions=weights)
    assert torch.equal(got.hidden_states, expected.hidden_states)
    if weights:
        assert torch.equal(got.attn_weights, expected.attn_weights)


def test_the_forecast_is_the_official_modules_bit_for_bit():
    """The whole model with the official group attention put back forecasts the same bits,
    with a window whose first patch is padding."""
    module, batch = make_module(), make_batch()
    official = copy.deepcopy(module)
    for layer in official.modules():
        if type(layer) is OwnGroupSelfAttention:
            layer.__class__ = GroupSelfAttention
    assert any(type(m) is OwnGroupSelfAttention for m in module.modules())
    assert not any(type(m) is OwnGroupSelfAttention for m in official.modules())
    assert torch.equal(module.forecast(batch).quantiles, official.forecast(batch).quantiles)


def test_an_official_checkpoint_loads_and_forecasts_identically(tmp_path):
    torch.manual_seed(5)
    official = Chronos2Model(Chronos2CoreConfig(**CHRONOS2_FIELDS, **tiny_fields()))
    Chronos2Pipeline(official).save_pretrained(tmp_path / "official")
    module, batch = make_module(), make_batch()
    loaded = make_module(checkpoint=str(tmp_path / "official"))
    assert loaded.resolved_checkpoint.kind == "path"
    raw = torch.stack(Chronos2Pipeline(official.eval()).predict(list(batch["context"]), HORIZON))
    expected = raw[:, 0].sort(dim=1).values[:, 4]
    torch.testing.assert_close(loaded.forecast(batch).median, expected, rtol=0, atol=1e-5)
    assert not torch.equal(module.forecast(batch).median, loaded.forecast(batch).median)


def test_export_is_loaded_by_the_official_pipeline(tmp_path):
    module, batch = make_module(), make_batch()
    module.export(str(tmp_path / "export"))
    pipeline = Chronos2Pipeline.from_pretrained(str(tmp_path / "export"))
    raw = torch.stack(pipeline.predict(list(batch["context"]), HORIZON))
    torch.testing.assert_close(
        module.forecast(batch).median, raw[:, 0].sort(dim=1).values[:, 4], atol=1e-5, rtol=0
    )


def test_a_checkpoint_that_does_not_fit_names_the_tensor(tmp_path):
    make_module(d_ff=64).export(str(tmp_path / "export"))
    config = json.loads((tmp_path / "export/config.json").read_text())
    (tmp_path / "export/config.json").write_text(json.dumps({**config, "d_ff": 48}))
    with pytest.raises(
        CheckpointError, match=r"encoder\.block\.0\.layer\.2\.mlp\.wi\.weight has shape \(64, 32\)"
    ):
        make_module(checkpoint=str(tmp_path / "export"))


def test_a_checkpoint_of_another_model_is_refused(tmp_path):
    (tmp_path / "bolt").mkdir()
    config = {"model_type": "t5", "architectures": ["ChronosBoltModelForForecasting"]}
    (tmp_path / "bolt/config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="not a Chronos-2 checkpoint.*model=chronos_bolt"):
        make_module(checkpoint=str(tmp_path / "bolt"))


def test_a_horizon_beyond_the_model_says_so():
    with pytest.raises(ValueError, match="max_output_patches=4"):
        Chronos2Module(
            checkpoint="scratch",
            sizes={"tiny": tiny_fields()},
            size="tiny",
            optimizer=partial(torch.optim.AdamW, lr=1e-3),
            context_length=CONTEXT,
            prediction_length=4 * PATCH + 1,
        )


def test_training_memory_is_the_weights_plus_a_part_that_grows_with_the_batch():
    module = make_module()
    weights = module.training_memory_bytes(0)
    assert weights == 16 * sum(p.numel() for p in module.parameters())
    assert module.training_memory_bytes(8) > module.training_memory_bytes(4) > weights
    assert module.forecast_memory_bytes(4) < module.training_memory_bytes(4)


def test_missing_chronos_names_the_install_command(monkeypatch):
    real_import = builtins.__import__

    def no_chronos2(name, *args, **kwargs):
        if name.startswith("chronos.chronos2"):
            raise ImportError("No module named 'chronos.chronos2'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_chronos2)
    monkeypatch.delitem(sys.modules, "isoprobe.models.chronos.chronos2")
    with pytest.raises(ImportError, match="pip install 'chronos-forecasting"):
        importlib.import_module("isoprobe.models.chronos.chronos2")
    monkeypatch.undo()
    importlib.import_module("isoprobe.models.chronos.chronos2")
