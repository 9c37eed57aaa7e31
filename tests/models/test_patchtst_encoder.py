"""The lean evaluation forward of PatchTST's encoder: the official forward's outputs to float
rounding, and the official forward itself wherever something watches the modules, trains, asks
for more than the last hidden state or the configuration is one the lean forward does not
reproduce."""

from __future__ import annotations

import copy
import threading
from functools import partial
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn.modules.module import register_module_forward_hook
from transformers.models.patchtst.modeling_patchtst import PatchTSTBatchNorm, PatchTSTEncoder

from isoprobe.models import patchtst_encoder
from isoprobe.models.patchtst import PatchTSTModule
from isoprobe.models.patchtst_encoder import LeanPatchTSTEncoder
from tests.models.lean_paths import probe_captures, spy_on_paths

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/patchtst.yaml")
CONTEXT, HORIZON = 72, 8  # 8 patches of 16 every 8


def modules(**fields) -> tuple[PatchTSTModule, PatchTSTModule]:
    """A seeded scratch PatchTST (lean encoder, as the wrapper builds it) with batch-norm
    statistics far from their defaults, and a copy whose encoder is transformers' own."""
    torch.manual_seed(0)
    sizes = OmegaConf.to_container(CONFIG.sizes)
    sizes["paper"].update(d_model=16, ffn_dim=24, **fields)
    lean = PatchTSTModule(
        checkpoint="scratch",
        sizes=sizes,
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=CONTEXT,
        prediction_length=HORIZON,
    ).eval()
    for module in lean.modules():
        if isinstance(module, PatchTSTBatchNorm):
            module.batchnorm.running_mean.normal_(0.0, 0.5)
            module.batchnorm.running_var.uniform_(0.3, 3.0)
            module.batchnorm.weight.data.normal_(1.0, 0.3)
            module.batchnorm.bias.data.normal_(0.0, 0.3)
    official = copy.deepcopy(lean)
    official.model.model.encoder.__class__ = PatchTSTEncoder
    return lean, official


def contexts(case: str = "missing", windows: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    context = torch.randn(windows, CONTEXT, generator=g).cumsum(-1) * 3 + 50
    if case == "missing":
        context[0, :30] = float("nan")  # left padding: whole patches unobserved
        context[1, 40:45] = float("nan")  # missing values inside a patch
    return context


@pytest.fixture
def lean_calls(monkeypatch) -> list[bool]:
    """One entry per forward of a lean encoder: whether it took the lean path."""
    return spy_on_paths(monkeypatch, LeanPatchTSTEncoder, PatchTSTEncoder)


def encoder_outputs(lean: PatchTSTModule, official: PatchTSTModule, patches: torch.Tensor):
    with torch.no_grad():
        got = lean.model.model.encoder(patches).last_hidden_state
        expected = official.model.model.encoder(patches).last_hidden_state
    return got, expected


@pytest.mark.parametrize("case", ["observed", "missing"])
def test_the_lean_encoder_forecasts_as_the_official(case, lean_calls):
    lean, official = modules()
    batch = {"context": contexts(case)}
    got, expected = lean.forecast(batch), official.forecast(batch)
    assert lean_calls == [True]
    assert got.quantiles.shape == expected.quantiles.shape
    torch.testing.assert_close(got.quantiles, expected.quantiles, rtol=1e-5, atol=1e-4)
    assert not torch.equal(got.quantiles[0], got.quantiles[1])


def test_the_lean_encoder_outputs_equal_the_official_on_random_patches(lean_calls):
    """Several channels (one shared embedding) folded into the batch, inputs far from the
    scaler's range; a channel count the embedding was not built for is the official error."""
    lean, official = modules()
    with pytest.raises(ValueError, match="number of input channels"):
        encoder_outputs(lean, official, torch.randn(3, 2, 8, 16))
    for module in (lean, official):
        module.model.model.encoder.embedder.num_input_channels = 2
    patches = torch.randn(3, 2, 8, 16) * 4 + 1
    got, expected = encoder_outputs(lean, official, patches)
    assert lean_calls == [False, True] and got.shape == (3, 2, 8, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_other_batch_sizes_reuse_the_scratch_buffers_without_touching_earlier_outputs():
    lean, official = modules()
    first = lean.forecast({"context": contexts(windows=6)}).median
    kept = first.clone()
    for windows in (2, 9, 6):
        batch = {"context": contexts(windows=windows)}
        got, expected = lean.forecast(batch).median, official.forecast(batch).median
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    assert torch.equal(first, kept)


def test_buffers_over_the_limit_are_not_kept(monkeypatch):
    """A limit of 1000 elements: the scores (5 windows x 4 heads x 8 x 8 patches, 1280) and the
    query-key-value projections (5 x 8 patches x 48, 1920) are made anew, the smaller buffers
    kept; the forecast is the same."""
    lean, official = modules()
    batch = {"context": contexts()}
    monkeypatch.setattr(patchtst_encoder, "SCRATCH_LIMIT", 1000)
    monkeypatch.setattr(patchtst_encoder, "_BUFFERS", threading.local())
    got = lean.forecast(batch).median
    torch.testing.assert_close(got, official.forecast(batch).median, rtol=1e-5, atol=1e-4)
    kept = {name for name, _ in patchtst_encoder._BUFFERS.buffers}
    assert kept == {"attended", "merged", "inner"}


def test_inference_mode_and_no_grad_forecasts_alternate():
    """Tensors made in inference mode cannot be written outside it: each mode has its own
    scratch buffers and folded matrices made in one serve the other."""
    lean, official = modules()
    batch = {"context": contexts()}
    expected = official.forecast(batch).median
    for _ in range(2):
        with torch.inference_mode():
            inside = lean.forecast(batch).median
        torch.testing.assert_close(inside, expected, rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(lean.forecast(batch).median, expected, rtol=1e-5, atol=1e-4)


def test_changed_parameters_and_statistics_fold_again(lean_calls):
    """A training step's new weights, new running statistics, new weights loaded: the lean
    forward reads them, as the official does."""
    lean, official = modules()
    patches = torch.randn(4, 1, 8, 16)
    encoder_outputs(lean, official, patches)
    for module in (lean, official):
        layer = module.model.model.encoder.layers[1]
        with torch.no_grad():
            layer.self_attn.k_proj.weight.mul_(1.5)
            layer.ff[3].bias.add_(0.2)
            layer.norm_sublayer3.batchnorm.running_var.mul_(2.0)
    got, expected = encoder_outputs(lean, official, patches)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.manual_seed(5)
    state = {
        k: torch.rand_like(v) + 0.5 if "running_var" in k else torch.randn_like(v) * 0.3
        for k, v in lean.state_dict().items()
        if v.is_floating_point()
    }
    lean.load_state_dict(state, strict=False)
    official.load_state_dict(state, strict=False)
    got, expected = encoder_outputs(lean, official, patches)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert lean_calls == [True, True, True]


def test_probe_captures_are_unchanged_and_lean_forecasts_resume(lean_calls):
    """The probe's hooks see the official modules' calls, with the values of a model without
    the lean encoder; once they are removed, forecasts are lean again."""
    lean, official = modules()
    batch = {"context": contexts(), "target": torch.randn(5, HORIZON)}
    captured = {"lean": probe_captures(lean, batch), "official": probe_captures(official, batch)}
    assert lean_calls == [False]
    assert (
        captured["lean"].keys()
        == captured["official"].keys()
        == {
            "embed",
            "encoder.0",
            "encoder.1",
            "encoder.0.attn",
            "encoder.1.attn",
        }
    )
    for name, value in captured["lean"].items():
        assert torch.equal(value, captured["official"][name]), name
    lean.forecast(batch)
    assert lean_calls == [False, True]


def test_a_hook_on_any_submodule_or_a_global_hook_runs_the_official_forward(lean_calls):
    lean, official = modules()
    patches = torch.randn(2, 1, 8, 16)
    seen: list[str] = []
    handle = (
        lean.model.model.encoder.layers[0]
        .ff[1]
        .register_forward_pre_hook(lambda *_: seen.append("activation"))
    )
    got, expected = encoder_outputs(lean, official, patches)
    handle.remove()
    assert torch.equal(got, expected) and seen == ["activation"]
    handle = register_module_forward_hook(lambda *_: seen.append("call"))
    try:
        encoder_outputs(lean, official, patches)
    finally:
        handle.remove()
    assert lean_calls == [False, False] and "call" in seen


def test_training_and_gradients_run_the_official_forward(lean_calls):
    lean, official = modules()
    lean.train(), official.train()
    batch = {"context": contexts(), "target": torch.randn(5, HORIZON)}
    torch.manual_seed(3)
    got = lean.loss(batch)
    torch.manual_seed(3)
    assert torch.equal(got, official.loss(batch))
    got.backward()
    assert lean.model.model.encoder.layers[0].self_attn.q_proj.weight.grad is not None
    lean.eval()
    lean.model.model.encoder.layers[1].ff[2].train()  # one dropout left training
    with torch.no_grad():
        lean.model.model.encoder(torch.randn(2, 1, 8, 16))
    lean.model.model.encoder.layers[1].ff[2].eval()
    lean.model.model.encoder(torch.randn(2, 1, 8, 16))  # gradients enabled
    assert lean_calls == [False, False, False]


@pytest.mark.parametrize("asked", ["output_hidden_states", "output_attentions"])
def test_outputs_asked_for_run_the_official_forward(asked, lean_calls):
    lean, official = modules()
    patches = torch.randn(2, 1, 8, 16)
    with torch.no_grad():
        got = lean.model.model.encoder(patches, **{asked: True})
        expected = official.model.model.encoder(patches, **{asked: True})
    assert lean_calls == [False]
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    name = "hidden_states" if asked == "output_hidden_states" else "attentions"
    assert len(getattr(got, name)) == 2


@pytest.mark.parametrize(
    "fields",
    [
        {"norm_type": "layernorm"},
        {"pre_norm": False},
        {"use_cls_token": True},
        {"activation_function": "relu"},
    ],
)
def test_configurations_it_does_not_reproduce_run_the_official_forward(fields, lean_calls):
    lean, official = modules(**fields)
    got = lean.forecast({"context": contexts()}).quantiles
    assert torch.equal(got, official.forecast({"context": contexts()}).quantiles)
    assert lean_calls == [False]


def test_the_swap_keeps_every_parameter_name():
    lean, official = modules()
    assert type(lean.model.model.encoder) is LeanPatchTSTEncoder
    assert lean.state_dict().keys() == official.state_dict().keys()
    lean.forecast({"context": contexts()})
    assert lean.state_dict().keys() == official.state_dict().keys()
