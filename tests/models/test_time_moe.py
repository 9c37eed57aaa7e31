"""Time-MoE: parity with the official code on the same weights (the fixture of
tests/fixtures/time_moe/make_fixture.py: a tiny random model saved by the official code in the
published layout, bfloat16 weights and an ``auto_map``), the roll-out's choice of heads, the
loss's parts, and what a checkpoint directory must hold."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from isoprobe.models.checkpoints import CheckpointError
from isoprobe.models.time_moe.config import shape_from_fields
from isoprobe.models.time_moe.module import head_for, normalisation, positions_of, shifted_windows
from isoprobe.models.time_moe.network import SparseExperts, balance_loss
from isoprobe.probing.capture import capture_outputs
from tests.models.published import built_model, copied_checkpoint, largest_difference

FIXTURE = Path(__file__).parents[1] / "fixtures" / "time_moe"
#: float32 against float32 on the same (bfloat16-exact) weights: only summation order differs
TOLERANCE = 2e-5


def official() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "outputs.npz") as outputs:
        return dict(outputs)


def build(tmp_path, checkpoint: str, context: int, horizon: int, *overrides: str):
    return built_model(tmp_path, "time_moe", checkpoint, context, horizon, overrides)


def fixture_model(tmp_path):
    expected = official()
    context, target = expected["context"], expected["target"]
    model = build(tmp_path, str(FIXTURE), context.shape[1], target.shape[1])
    batch = {
        "context": torch.from_numpy(context),
        "target": torch.from_numpy(target),
        "loc": torch.zeros(len(context)),
        "scale": torch.ones(len(context)),
    }
    return model, batch, expected


def test_the_fixture_is_the_published_layout():
    config = json.loads((FIXTURE / "config.json").read_text())
    assert config["model_type"] == "time_moe" and "auto_map" in config
    assert {t.dtype for t in load_file(FIXTURE / "model.safetensors").values()} == {torch.bfloat16}


def test_every_layer_matches_the_official_code(tmp_path):
    model, batch, expected = fixture_model(tmp_path)
    layers = {**model.probe_layers("block"), **model.probe_layers("attention")}
    with torch.no_grad(), capture_outputs(layers) as captured:
        model.probe_forward(batch)
    assert len(layers) == 1 + 2 * model.shape.num_hidden_layers
    for name in layers:
        assert largest_difference(captured[name][0], expected[name], name) < TOLERANCE


def test_every_head_matches_the_official_code(tmp_path):
    """The declared ``head_modules`` map the last hidden state to the official heads' outputs."""
    model, batch, expected = fixture_model(tmp_path)
    context = batch["context"]
    values, observed, _, _ = model._inputs(context, context)
    with torch.no_grad():
        final, _ = model._hidden(values, observed)
        assert largest_difference(final, expected["final"], "final norm") < TOLERANCE
        heads = model.head_modules()
        assert len(heads) == len(model.shape.horizon_lengths)
        for j, head in enumerate(heads):
            name = f"head.{j}"
            assert largest_difference(head(final), expected[name], name) < TOLERANCE


def test_the_input_modules_hold_exactly_the_parameters_embed_is_made_of(tmp_path):
    """Every parameter ``embed`` depends on is in ``input_modules``, and no other."""
    model, batch, _ = fixture_model(tmp_path)
    kept = []
    hook = model.probe_layers()["embed"].register_forward_hook(lambda _m, _a, out: kept.append(out))
    model.probe_forward(batch)
    hook.remove()
    kept[0].sum().backward()
    reached = {id(p) for p in model.parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    declared = {id(p) for m in model.input_modules() for p in m.parameters()}
    assert reached == declared


def test_a_multi_step_forecast_matches_official_generate(tmp_path):
    """13 steps with heads of 1, 4 and 8: generate takes 8, then 4, then 1; one window is
    left-padded (attention_mask 0 there)."""
    model, batch, expected = fixture_model(tmp_path)
    forecast = model.forecast(batch)
    assert largest_difference(forecast.median, expected["forecast"], "forecast") < 1e-4
    assert (forecast.quantiles == forecast.median.unsqueeze(1)).all()


def test_the_training_loss_with_its_auxiliary_term_matches_the_official_loss(tmp_path):
    """On the fully observed windows (the official loss_masks cannot leave out the predictions
    made at a missing step, as isoprobe's loss does)."""
    model, batch, expected = fixture_model(tmp_path)
    rows = torch.from_numpy(expected["loss_rows"])
    batch = {key: value[rows] for key, value in batch.items()}
    with torch.no_grad():
        loss = model.loss(batch)
    # the auxiliary term is 0.02 x about 2 (top-2 routing): leaving it out would miss by ~0.04
    assert largest_difference(loss, expected["loss"], "loss") < TOLERANCE


@pytest.mark.parametrize(
    ("left", "head"), [(13, 2), (8, 2), (7, 1), (4, 1), (3, 0), (1, 0), (100, 2)]
)
def test_the_roll_out_takes_the_largest_head_that_fits(left, head):
    assert head_for([1, 4, 8], left) == head


def test_a_head_longer_than_the_steps_left_is_cut_when_no_head_fits():
    assert head_for([4, 8], 2) == 0


def test_normalisation_is_the_observed_contexts_mean_and_unbiased_std():
    context = torch.tensor([[float("nan"), 1.0, 2.0, 3.0, 6.0], [5.0] * 5])
    mean, scale = normalisation(context)
    torch.testing.assert_close(mean[:, 0], torch.tensor([3.0, 5.0]))
    # [1, 2, 3, 6]: squared deviations 4 + 1 + 0 + 9 = 14 over 3; a constant window: |mean|
    torch.testing.assert_close(scale[:, 0], torch.tensor([(14 / 3) ** 0.5, 5.0]))


def test_positions_count_the_observed_steps_before():
    observed = torch.tensor([[False, False, True, True, False, True]])
    assert positions_of(observed).tolist() == [[1, 1, 0, 1, 1, 2]]


def test_a_gap_inside_the_context_forecasts_as_the_window_without_it(tmp_path):
    """Missing steps are what the official code makes of padding, wherever they are: no step
    reads them and the rotary positions count only the observed steps before, so a window with
    a gap inside its context forecasts as the same observed values left-padded (positions that
    counted the missing steps would turn every query and key after the gap further: 0.17 apart
    here, against 2e-6). On the bundled (trained) weights: a random model's attention is near
    uniform, and rotary positions then change next to nothing."""
    model = build(tmp_path, "bundled", 24, 8)
    g = torch.Generator().manual_seed(4)
    values = torch.randn(1, 18, generator=g).cumsum(-1) + 20
    gaps = torch.full((1, 6), float("nan"))
    inside = torch.cat([values[:, :5], gaps, values[:, 5:]], dim=1)
    padded = torch.cat([gaps, values], dim=1)
    zeros = torch.zeros(1)

    def forecast(context: torch.Tensor) -> torch.Tensor:
        batch = {"context": context, "target": torch.zeros(1, 8), "loc": zeros, "scale": zeros}
        return model.forecast(batch).median

    torch.testing.assert_close(forecast(inside), forecast(padded), rtol=1e-5, atol=1e-5)


def test_shifted_windows_are_the_next_steps_zero_padded():
    series = torch.tensor([[1.0, 2.0, 3.0]])
    assert shifted_windows(series, 2).tolist() == [[[1.0, 2.0], [2.0, 3.0], [3.0, 0.0]]]


def test_the_balance_loss_is_one_for_a_uniform_router_and_more_when_it_is_skewed():
    """Uniform probabilities: E * sum_e (share_e * 1/E) = top_k (the shares sum to top_k)."""
    tokens, experts = 8, 4
    uniform = [torch.zeros(tokens, experts)]
    observed = torch.ones(1, tokens, dtype=torch.bool)
    assert float(balance_loss(uniform, 2, observed)) == pytest.approx(2.0)
    skewed = [torch.tensor([[4.0, 3.0, 0.0, 0.0]]).repeat(tokens, 1)]
    assert float(balance_loss(skewed, 2, observed)) > 2.5
    # tokens not observed count for nothing
    mixed = [torch.cat([skewed[0][:4], torch.zeros(4, experts)])]
    half = torch.tensor([[True] * 4 + [False] * 4])
    whole = float(balance_loss(skewed, 2, observed))
    assert float(balance_loss(mixed, 2, half)) == pytest.approx(whole)


def test_a_tokens_output_does_not_depend_on_how_many_tokens_share_its_expert():
    """Expert 3 takes only the tokens whose first feature is -1: 3 of the first 300 tokens, 43
    of all 600. The first 300 give bit for bit the same outputs in either batch, although
    expert 3 multiplies 3 rows in one and 43 in the other (trainer=ddp_sim, half the batch per
    process, equals one process so). Bit for bit on one thread, as each test worker runs; with
    several, the BLAS may split 3 rows' inner products otherwise than 43 rows', so there the
    outputs agree to float rounding."""
    torch.manual_seed(0)
    fields = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    routed = {"num_experts": 4, "num_experts_per_tok": 2}
    experts = SparseExperts(shape_from_fields({**fields, **routed}, "test"))
    tokens = torch.randn(1, 600, 64)
    tokens[..., 0] = 1.0
    tokens[0, [0, 1, 2, *range(400, 440)], 0] = -1.0
    with torch.no_grad():
        experts.gate.weight[:, 0] = 0.0
        experts.gate.weight[3] = 0.0
        experts.gate.weight[3, 0] = -50.0
        whole, logits = experts(tokens)
        assert int((logits.topk(2).indices == 3).sum()) == 43
        part, _ = experts(tokens[:, :300])
        torch.testing.assert_close(part, whole[:, :300], rtol=1e-6, atol=1e-6)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            whole, _ = experts(tokens)
            part, _ = experts(tokens[:, :300])
        finally:
            torch.set_num_threads(threads)
    assert torch.equal(part, whole[:, :300])


def test_another_architectures_config_is_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path)
    (directory / "config.json").write_text(
        json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})
    )
    with pytest.raises(CheckpointError, match=r"not a Time-MoE config \(model_type='t5'"):
        build(tmp_path, str(directory), 24, 8)


def test_a_config_with_an_unknown_key_is_refused_naming_it(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path, chronos_config={"n_tokens": 4096})
    with pytest.raises(CheckpointError, match=r"unexpected keys \['chronos_config'\]"):
        build(tmp_path, str(directory), 24, 8)


def test_weights_that_do_not_fit_the_config_are_refused_naming_the_tensor(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path)
    weights = load_file(directory / "model.safetensors")
    weights["lm_heads.0.out_layer.weight"] = torch.zeros(3, 16, dtype=torch.bfloat16)
    del weights["model.norm.weight"]
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"lm_heads.0.out_layer.weight has shape \(3, 16\)"):
        build(tmp_path, str(directory), 24, 8)
    weights["lm_heads.0.out_layer.weight"] = torch.zeros(1, 16, dtype=torch.bfloat16)
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"1 weights missing \(e.g. \['model.norm.weight'\]"):
        build(tmp_path, str(directory), 24, 8)


def test_a_shape_isoprobe_does_not_build_is_refused_naming_the_field(tmp_path):
    directory = copied_checkpoint(FIXTURE, tmp_path, use_dense=True, apply_aux_loss=False)
    with pytest.raises(CheckpointError, match=r"use_dense=True"):
        build(tmp_path, str(directory), 24, 8)


def test_an_export_is_the_published_layout_and_reloads_the_same_weights(tmp_path):
    model, _, _ = fixture_model(tmp_path)
    model.export(str(tmp_path / "export"), dtype="bfloat16")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    published = json.loads((FIXTURE / "config.json").read_text())
    kept = {k: published[k] for k in published if k not in ("transformers_version",)}
    assert {k: config[k] for k in kept} == kept
    exported = load_file(tmp_path / "export" / "model.safetensors")
    original = load_file(FIXTURE / "model.safetensors")
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[k], original[k]) for k in original)
