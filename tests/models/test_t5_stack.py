"""The lean evaluation forward of Chronos-Bolt's T5 stacks: the official forward's bits, and the
official forward itself wherever something watches the modules or the lean one would differ."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn.modules.module import register_module_forward_hook
from transformers.models.t5.modeling_t5 import T5Stack

from isoprobe.models.chronos.bolt import ChronosBoltModule
from isoprobe.models.compression import FactoredLinear
from isoprobe.models.t5_stack import LeanT5Stack
from tests.models.lean_paths import probe_captures, spy_on_paths

CONFIG = OmegaConf.load(Path(__file__).resolve().parents[2] / "configs/model/chronos_bolt.yaml")
BOLT = {
    "context_length": 64,
    "prediction_length": 8,
    "input_patch_size": 16,
    "input_patch_stride": 16,
    "quantiles": [0.1, 0.5, 0.9],
    "use_reg_token": True,
}


def modules() -> tuple[ChronosBoltModule, ChronosBoltModule]:
    """A seeded scratch Chronos-Bolt (lean stacks, as the wrapper builds it) and a copy whose
    stacks are transformers' own ``T5Stack``."""
    torch.manual_seed(0)
    sizes = OmegaConf.to_container(CONFIG.sizes)
    sizes["mini"].update(
        d_model=16, d_kv=4, d_ff=32, num_layers=3, num_decoder_layers=2, chronos_config=BOLT
    )
    lean = ChronosBoltModule(
        checkpoint="scratch",
        sizes=sizes,
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
        context_length=64,
        prediction_length=8,
    ).eval()
    official = copy.deepcopy(lean)
    official.model.encoder.__class__ = official.model.decoder.__class__ = T5Stack
    return lean, official


def contexts(case: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    context = torch.randn(5, 64, generator=g).cumsum(-1) * 3 + 50
    if case == "missing":
        context[0, :40] = float("nan")  # left padding: whole patches unobserved
        context[1, 30:35] = float("nan")  # missing values inside a patch
        context[2] = float("nan")  # nothing observed but REG
    return context


@pytest.fixture
def lean_calls(monkeypatch) -> list[bool]:
    """One entry per forward of a lean stack: whether it took the lean path."""
    return spy_on_paths(monkeypatch, LeanT5Stack, T5Stack)


@pytest.mark.parametrize("case", ["observed", "missing"])
def test_the_lean_stacks_are_the_official_forward_bit_for_bit(case, lean_calls):
    """Encoder output, decoder output and the quantiles: equal bits, with and without masked
    patches (an all-observed window, left padding, a gap, a window of REG alone)."""
    lean, official = modules()
    context = contexts(case)
    with torch.no_grad():
        encoded, _, embeds, mask = lean.model.encode(context)
        decoded = lean.model.decode(embeds, mask, encoded)
        assert lean_calls == [True, True]
        expected, _, embeds, mask = official.model.encode(context)
        assert torch.equal(encoded, expected)
        assert torch.equal(decoded, official.model.decode(embeds, mask, expected))
    got = lean.forecast({"context": context}).quantiles
    assert torch.equal(got, official.forecast({"context": context}).quantiles)


def test_projections_other_than_linear_layers_are_called():
    """Factored projections (compression) in an attention and a feed-forward: called."""
    lean, official = modules()
    for module in (lean, official):
        attention = module.model.encoder.block[1].layer[0].SelfAttention
        torch.manual_seed(2)
        attention.q = FactoredLinear(16, 16, rank=3, bias=False)
        feed_forward = module.model.decoder.block[0].layer[-1].DenseReluDense
        feed_forward.wo = FactoredLinear(32, 16, rank=5, bias=False)
    context = contexts("missing")
    with torch.no_grad():
        assert torch.equal(
            lean.model(context).quantile_preds, official.model(context).quantile_preds
        )


def _block_hook(module: ChronosBoltModule, seen: list) -> None:
    module.model.encoder.block[1].register_forward_hook(lambda *_: seen.append("block"))


def _attention_pre_hook(module: ChronosBoltModule, seen: list) -> None:
    module.self_attention_module("decoder", 0).register_forward_pre_hook(
        lambda *_: seen.append("attention")
    )


@pytest.mark.parametrize(
    "watch, paths", [(_block_hook, [False, True]), (_attention_pre_hook, [True, False])]
)
def test_hooked_submodules_run_the_official_forward(watch, paths, lean_calls):
    """The stack with the hooked module (the encoder's block, the decoder's attention) runs the
    official forward; the other stays lean."""
    lean, official = modules()
    seen: list[str] = []
    watch(lean, seen)
    context = contexts("missing")
    with torch.no_grad():
        got = lean.model(context).quantile_preds
        assert lean_calls == paths and len(seen) == 1
        assert torch.equal(got, official.model(context).quantile_preds)


def test_a_global_module_hook_runs_the_official_forward(lean_calls):
    lean, _ = modules()
    seen: list[str] = []
    handle = register_module_forward_hook(lambda *_: seen.append("call"))
    try:
        with torch.no_grad():
            lean.model(contexts("observed"))
    finally:
        handle.remove()
    assert lean_calls == [False, False] and seen


def test_training_runs_the_official_forward_with_its_dropout(lean_calls):
    lean, official = modules()
    lean.train(), official.train()
    context = contexts("missing")
    torch.manual_seed(3)
    got = lean.model(context).quantile_preds
    torch.manual_seed(3)
    assert torch.equal(got, official.model(context).quantile_preds)
    assert lean_calls == [False, False]
    lean.eval()
    lean.model.decoder.block[0].layer[-1].dropout.train()  # one module left training
    with torch.no_grad():
        lean.model(context)
    assert lean_calls[2:] == [True, False]


@pytest.mark.parametrize(
    "asked", [{"output_hidden_states": True}, {"output_attentions": True}, {"return_dict": False}]
)
def test_outputs_asked_for_run_the_official_forward(asked, lean_calls):
    """Hidden states, attentions or a tuple: the official forward, whose output capture (hooks
    transformers installs) still finds the stack's layers."""
    lean, official = modules()
    embeds = torch.randn(2, 5, 16)
    with torch.no_grad():
        got = lean.model.encoder(inputs_embeds=embeds, **asked)
        expected = official.model.encoder(inputs_embeds=embeds, **asked)
    assert lean_calls == [False]
    assert torch.equal(got[0], expected[0])
    if "output_hidden_states" in asked:
        assert len(got.hidden_states) == 4  # the input and each of the 3 blocks' output
        for a, b in zip(got.hidden_states, expected.hidden_states, strict=True):
            assert torch.equal(a, b)


def test_probe_captures_are_unchanged_and_lean_forecasts_resume(lean_calls):
    """The probe's hooks on every block see the official modules' calls, with the values of
    a model without lean stacks; once they are removed, forecasts are lean again."""
    lean, official = modules()
    batch = {"context": contexts("missing"), "target": torch.randn(5, 8)}
    captured = {"lean": probe_captures(lean, batch), "official": probe_captures(official, batch)}
    assert captured["lean"].keys() == captured["official"].keys()
    for name, value in captured["lean"].items():
        assert torch.equal(value, captured["official"][name]), name
    del lean_calls[:]
    lean.forecast(batch)
    assert lean_calls == [True, True]
