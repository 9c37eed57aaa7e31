"""The model contract (isoprobe.models.base.ForecastModule), checked for every configs/model/*.yaml
built from scratch: layers and sites, token masks (exactly the tokens that carry observed
values), ``embed`` as the first block's input, hooks, a probe that changes nothing, a finite loss
and gradients on windows with gaps, forecasts of the right shape and scale drawn from
``num_samples`` samples, memory estimates within a factor of the measured peak,
export/reload, and the input, head and feed-forward modules that model.adapt trains. The
properties of tests/models/contract_properties.py (blocks in order, each projection in its
role, the head, the input layers, a forecast that reads every step, real tokens at every stack,
a loss that reads the target, a complete head list, a horizon longer than one call) are checked
on every model,
and each mistake they exist for is planted into every model to see it caught."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import get_class
from torch import nn

from isoprobe.models.base import ATTENTION_PROJECTIONS, PROBE_SITES, Forecast, ForecastModule
from isoprobe.probing.capture import capture_outputs
from isoprobe.tasks.peak_memory import cpu_peak_bytes, cpu_peak_supported, weight_bytes
from isoprobe.tasks.runner import build_model
from tests.conftest import CONFIG_DIR, compose_config
from tests.models import contract_properties as props

MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
CONTEXT, HORIZON, BATCH = 32, 8, 3


#: each model built from scratch once per test process, with the random state its build left:
#: (name, overrides, context, horizon) -> (model, random state)
BUILT: dict[tuple, tuple[ForecastModule, torch.Tensor]] = {}


def build(
    tmp_path,
    name: str,
    checkpoint: str = "scratch",
    overrides: Sequence[str] = (),
    context: int = CONTEXT,
    horizon: int = HORIZON,
) -> ForecastModule:
    """``model=<name>`` built in eval mode after ``torch.manual_seed(0)``. From scratch, a deep
    copy of the one build of these arguments, with the random state that build left: the same
    weights, buffers and random state as a build of its own, without its compose and build."""
    key = (name, tuple(overrides), context, horizon)
    if checkpoint != "scratch" or key not in BUILT:
        cfg = compose_config(
            tmp_path, [f"model={name}", f"model.checkpoint={checkpoint}", *overrides]
        )
        windows = SimpleNamespace(
            context_length=context, prediction_length=horizon, season_length=1, freq="h"
        )
        torch.manual_seed(0)
        model = build_model(cfg.model, windows).eval()
        if checkpoint != "scratch":
            return model
        BUILT[key] = (model, torch.get_rng_state())
    model, state = BUILT[key]
    torch.set_rng_state(state)
    return copy.deepcopy(model)


def make_batch(scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    context = (torch.randn(BATCH, CONTEXT, generator=g).cumsum(-1) + 20) * scale
    context[0, :20] = float("nan")  # left padding: a short series, whole patches missing
    target = (torch.randn(BATCH, HORIZON, generator=g) + 20) * scale
    return {
        "context": context,
        "target": target,
        "loc": torch.zeros(BATCH),
        "scale": torch.ones(BATCH),
    }


def seeded_forecast(model: ForecastModule, batch: dict[str, torch.Tensor]):
    torch.manual_seed(11)
    return model.forecast(batch)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("site", PROBE_SITES)
def test_layers_masks_and_hooks(tmp_path, name, site):
    model = build(tmp_path, name)
    if site == "attention" and not model.attends:
        # a model without attention refuses the attention site, naming itself
        with pytest.raises(ValueError, match=r"has no attention.*'attention' does not apply"):
            model.probe_layers(site)
        return
    layers = model.probe_layers(site)
    assert layers and len(set(layers)) == len(layers)
    own = {id(m) for m in model.modules()}
    assert all(isinstance(m, nn.Module) and id(m) in own for m in layers.values())
    assert all(n.endswith(".attn") for n in layers) == (site == "attention")

    batch = make_batch()
    with torch.no_grad(), capture_outputs(layers) as captured:
        model.probe_forward(batch)
    masks = model.token_masks(batch, list(layers))
    assert set(masks) == set(layers)
    for layer, outputs in captured.items():
        assert len(outputs) == 1, layer  # each probed module runs once per probe pass
        hidden, mask = outputs[0], masks[layer]
        assert hidden.dim() >= 3 and mask.dtype == torch.bool, layer
        assert tuple(mask.shape) == tuple(hidden.shape[:-1]), layer
        assert int(mask.sum()) > 0, layer
        if layer == "embed" or layer.startswith("encoder."):
            # layers that read the context: the missing values are no real tokens
            assert int(mask.sum()) < mask.numel(), layer
    assert all(not m._forward_hooks for m in model.modules())  # the hooks are gone


#: the facts every wrapper declares in its own class body, and their types
FACTS = {"samples": bool, "lagged": bool, "stacks": tuple}


def model_class(tmp_path, name: str) -> type[ForecastModule]:
    """The wrapper class ``model=<name>`` builds, read from its configuration's target."""
    return get_class(compose_config(tmp_path, [f"model={name}"]).model._target_)


@pytest.mark.parametrize("name", MODELS)
def test_every_model_declares_its_facts_and_its_layers_are_its_stacks(tmp_path, name):
    cls = model_class(tmp_path, name)
    for fact, kind in FACTS.items():
        assert fact in vars(cls), f"{cls.__name__} does not declare {fact!r}"
        assert isinstance(vars(cls)[fact], kind), fact
    model = build(tmp_path, name)
    assert model.stacks and all(isinstance(stack, str) for stack in model.stacks)
    for site in PROBE_SITES:
        identities = model.probe_layer_identities(site)
        if site == "attention" and not model.attends:
            with pytest.raises(ValueError, match=r"has no attention"):
                model.probe_layers(site)  # named, but no module runs them
        else:
            assert list(identities) == list(model.probe_layers(site)), site
        assert all(layer.name == n and layer.site == site for n, layer in identities.items())
    blocks = [layer for layer in model.probe_layer_identities().values() if layer.is_block]
    attention = list(model.probe_layer_identities("attention").values())
    assert [(a.stack, a.index) for a in attention] == [(b.stack, b.index) for b in blocks]
    assert tuple(dict.fromkeys(layer.stack for layer in blocks)) == model.stacks
    for stack in model.stacks:
        layers = [layer for layer in blocks if layer.stack == stack]
        assert [layer.index for layer in layers] == list(range(len(layers))), stack
        depths = [layer.depth for layer in layers]
        assert depths[0] == 0.0 and depths == sorted(set(depths)), stack
        assert len(layers) == 1 or depths[-1] == 1.0, stack


@pytest.mark.parametrize("name", MODELS)
def test_a_layer_no_site_has_is_refused_by_name(tmp_path, name):
    model = build(tmp_path, name)
    real = next(iter(model.probe_layers()))
    for wrong in ("encoder.99", "decoder.99.attn", "lm_head"):
        with pytest.raises(KeyError, match=rf"unknown .* layer '{wrong}'; known: .*'{real}'"):
            model.token_masks(make_batch(), [real, wrong])


@pytest.mark.parametrize("name", MODELS)
def test_probing_changes_no_weight_and_no_random_state(tmp_path, name):
    model = build(tmp_path, name)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    with torch.no_grad(), capture_outputs(model.probe_layers()):
        model.probe_forward(make_batch())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", MODELS)
def test_forecasts_have_the_shape_and_follow_the_scale_of_the_context(tmp_path, name):
    model = build(tmp_path, name)
    forecast = seeded_forecast(model, make_batch())
    levels = len(model.quantile_levels)
    assert tuple(forecast.quantiles.shape) == (BATCH, levels, HORIZON)
    assert tuple(forecast.median.shape) == (BATCH, HORIZON)
    assert torch.isfinite(forecast.quantiles).all()
    assert (forecast.quantiles.diff(dim=1) >= 0).all()  # quantiles ordered by level
    scaled = seeded_forecast(model, make_batch(scale=100.0))
    torch.testing.assert_close(scaled.median, 100.0 * forecast.median, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("name", MODELS)
def test_export_and_reload_give_identical_forecasts(tmp_path, name):
    model = build(tmp_path, name)
    model.export(str(tmp_path / "export"))
    reloaded = build(tmp_path, name, checkpoint=str(tmp_path / "export"))
    batch = make_batch()
    first, again = seeded_forecast(model, batch), seeded_forecast(reloaded, batch)
    assert torch.equal(first.quantiles, again.quantiles)
    assert torch.equal(first.median, again.median)


@pytest.mark.parametrize("name", MODELS)
def test_attention_weights_are_the_parameters_the_blocks_apply(tmp_path, name):
    model = build(tmp_path, name)
    weights = model.attention_weights()
    blocks = [n for n in model.probe_layers("block") if n != "embed"]
    assert list(weights) == (blocks if model.attends else [])
    parameters = {id(p) for p in model.parameters()}
    for block, parts in weights.items():
        assert tuple(parts) == ATTENTION_PROJECTIONS, block
        q, k, v, o = (parts[p] for p in ATTENTION_PROJECTIONS)
        assert q.dim() == k.dim() == v.dim() == o.dim() == 2, block
        assert q.shape[1] == k.shape[1] == v.shape[1] == o.shape[0], block  # model width in
        assert q.shape[0] == k.shape[0] and o.shape[1] == v.shape[0], block
        # the parameters themselves or views of them (a fused projection split), never copies
        assert all(
            id(w) in parameters or (w._base is not None and id(w._base) in parameters)
            for w in parts.values()
        ), block


@pytest.mark.parametrize("name", MODELS)
def test_hyperparameters_are_saved_as_plain_values(tmp_path, name):
    model = build(tmp_path, name)
    hparams = dict(model.hparams)
    assert hparams["context_length"] == CONTEXT and hparams["prediction_length"] == HORIZON
    assert hparams["freq"] == "h"
    assert "optimizer" not in hparams and "scheduler" not in hparams
    # weights_only checkpoints hold plain containers only
    plain = (str, int, float, bool, type(None), list, tuple, dict)

    pending = list(hparams.values())
    while pending:
        value = pending.pop()
        assert isinstance(value, plain), type(value)
        if isinstance(value, dict):
            pending += value.values()
        elif isinstance(value, (list, tuple)):
            pending += value


NAN = float("nan")


#: a row's 21 observed context values in time order. Every value differs from its neighbours
#: in every digit the LLM writes: scaled so that the 0.95 quantile of |x| (the 20th of 21, 10) is
#: 1, they read 789, 123, 456, 123, 456, ..., 1000, 2111, so that every token of a value changes
#: when :func:`swapped_neighbours` moves the values; Chronos-T5's bins tell them apart too.
OBSERVED_ROW = [7.89, 1.23, 4.56] + [1.23, 4.56] * 8 + [10.0, 21.11]


def gapped_batch() -> dict[str, torch.Tensor]:
    """Windows with every kind of gap: left padding (row 0), missing values inside the context
    and the target (row 1), and missing last context steps and last target steps (row 2); each
    row has :data:`OBSERVED_ROW` at its observed context steps."""
    context = torch.full((BATCH, CONTEXT), NAN)
    target = torch.linspace(2.0, 9.0, HORIZON).repeat(BATCH, 1)
    observed = [list(range(11, CONTEXT)), [*range(5), *range(16, CONTEXT)], list(range(21))]
    for row, steps in enumerate(observed):
        context[row, steps] = torch.tensor(OBSERVED_ROW)
    target[1, 3:5] = NAN
    target[2, -2:] = NAN
    zeros = torch.zeros(BATCH)
    return {"context": context, "target": target, "loc": zeros, "scale": zeros + 1}


def swapped_neighbours(values: torch.Tensor) -> torch.Tensor:
    """Each row's observed values swapped with an observed neighbour, in pairs from the
    latest down (an odd one out joins the earliest pair in a rotated triple): every observed
    position gets another value, missing ones stay missing, and the values' multiset (so any
    scale or location computed from them) stays the same."""
    moved = values.clone()
    for row in range(values.shape[0]):
        observed = torch.isfinite(values[row]).nonzero().squeeze(1).flip(0).tolist()
        groups = [observed[i : i + 2] for i in range(0, len(observed), 2)]
        if len(groups[-1]) == 1 and len(groups) > 1:
            groups[-2:] = [groups[-2] + groups[-1]]
        for group in groups:
            moved[row, group] = values[row, group].roll(1)
    return moved


@pytest.mark.parametrize("name", MODELS)
def test_loss_and_gradients_are_finite_on_windows_with_gaps(tmp_path, name):
    model = build(tmp_path, name).train()
    torch.manual_seed(0)
    loss = model.loss(gapped_batch())
    assert loss.dim() == 0 and torch.isfinite(loss), float(loss)
    loss.backward()
    gradients = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert gradients, "the loss reaches no parameter"
    not_finite = [n for n, g in gradients.items() if not torch.isfinite(g).all()]
    assert not not_finite, f"non-finite gradients in {not_finite[:5]}"


@pytest.mark.parametrize("name", MODELS)
def test_masks_mark_exactly_the_tokens_that_carry_observed_values(tmp_path, name):
    """A token of ``embed`` carries an observed value exactly when its representation changes
    as the observed values move to other positions (same values: same scale); every layer with
    ``embed``'s token positions has ``embed``'s mask. A model that declares ``lagged`` (its
    tokens also carry earlier steps' values) has tokens at missing steps that carry observed
    values, so there only left padding (row 0) has exactly its real tokens carrying them."""
    model = build(tmp_path, name)
    batch = gapped_batch()
    moved = {
        **batch,
        "context": swapped_neighbours(batch["context"]),
        "target": swapped_neighbours(batch["target"]),
    }
    embed = {"embed": model.probe_layers()["embed"]}
    outputs = []
    for b in (batch, moved):
        with torch.no_grad(), capture_outputs(embed) as captured:
            model.probe_forward(b)
        outputs.append(captured["embed"][0])
    carries = (outputs[0] != outputs[1]).any(dim=-1)
    masks = model.token_masks(batch, list(model.probe_layers()))
    real = masks["embed"]
    rows = [0] if model.lagged else list(range(BATCH))
    if model.lagged:  # rows 1 and 2 have missing steps after observed ones
        assert (carries[1:] & ~real[1:]).any(), "declared lagged, yet no lag carries a value"
    for row in rows:
        assert torch.equal(real[row], carries[row]), (
            f"row {row}: marked real {real[row].int().tolist()}, "
            f"carry observed values {carries[row].int().tolist()}"
        )
    assert not (real & ~carries).any()  # no marked token without an observed value
    for layer, mask in masks.items():
        if mask.shape == real.shape:
            assert torch.equal(mask, real), layer


@pytest.mark.parametrize("name", MODELS)
def test_embed_is_what_the_first_block_reads(tmp_path, name):
    """``embed`` is the first block's input, every position of it: the value embeddings with
    whatever the model adds or puts in before the first block (position embeddings where it has
    them, special tokens such as REG or [MASK])."""
    model = build(tmp_path, name)
    read = []

    def keep_input(_module, args, kwargs):
        hidden = args[0] if args else next(v for v in kwargs.values() if torch.is_tensor(v))
        read.append(hidden.detach().clone())

    batch = make_batch()
    handle = props.first_block(model).register_forward_pre_hook(keep_input, with_kwargs=True)
    try:
        with torch.no_grad(), capture_outputs({"embed": model.probe_layers()["embed"]}) as got:
            model.probe_forward(batch)
    finally:
        handle.remove()
    embed, block_input = got["embed"][0], read[0]
    assert embed.shape == block_input.shape, (tuple(embed.shape), tuple(block_input.shape))
    assert torch.equal(embed, block_input)


def check_sampled_quantiles(forecast, count: int) -> None:
    """``forecast`` holds ``count`` samples per window, and its quantiles are theirs."""
    assert forecast.samples is not None
    assert tuple(forecast.samples.shape) == (BATCH, count, HORIZON)
    levels = torch.tensor(forecast.levels, dtype=forecast.samples.dtype)
    expected = torch.nanquantile(forecast.samples, levels, dim=1).permute(1, 0, 2)
    torch.testing.assert_close(forecast.quantiles, expected.to(forecast.quantiles.dtype))
    if count == 1:  # one sample: every quantile is that sample
        assert (forecast.quantiles == forecast.quantiles[:, :1]).all()


@pytest.mark.parametrize("name", MODELS)
def test_a_model_samples_exactly_when_it_declares_it(tmp_path, name):
    """A model that declares ``samples`` forecasts the quantiles of ``num_samples`` samples;
    one that does not returns no samples."""
    model = build(tmp_path, name)
    forecast = seeded_forecast(model, make_batch())
    assert (forecast.samples is not None) == model.samples
    if not model.samples:
        return
    for count in (1, 3):
        model = build(tmp_path, name, overrides=[f"model.num_samples={count}"])
        check_sampled_quantiles(seeded_forecast(model, make_batch()), count)


def test_patchtst_samples_with_its_distribution_head(tmp_path):
    """PatchTST's ``samples`` is its configuration's: ``loss=nll`` samples, ``mse`` does not."""
    for count in (1, 3):
        overrides = ["model.loss=nll", f"model.num_samples={count}"]
        model = build(tmp_path, "patchtst", overrides=overrides)
        assert model.samples
        check_sampled_quantiles(seeded_forecast(model, make_batch()), count)


#: an estimate may be this many times above or below the measured peak: the estimates count the
#: largest tensors a step keeps, not the allocator's slack nor every temporary; a factor of 4
#: still catches an estimate of nothing, or one that forgets the optimiser state (3 copies of
#: the weights) or the activations when they dominate
MEMORY_FACTOR = 4.0
MEMORY_BATCH = 16
#: fewer sample paths than the configurations' defaults, for speed (the estimates count them)
FEW_SAMPLES = ["model.num_samples=4"]


def memory_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    context = torch.randn(MEMORY_BATCH, CONTEXT, generator=g).cumsum(-1) + 20
    target = torch.randn(MEMORY_BATCH, HORIZON, generator=g) + 20
    zeros = torch.zeros(MEMORY_BATCH)
    return {"context": context, "target": target, "loc": zeros, "scale": zeros + 1}


def training_step(model: ForecastModule, batch: dict[str, torch.Tensor]) -> None:
    """One AdamW step from fresh gradients and optimiser state, as the first of a fit."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.loss(batch).backward()
    optimizer.step()


def within_factor(estimate: int, measured: int) -> bool:
    return measured / MEMORY_FACTOR <= estimate <= measured * MEMORY_FACTOR


@pytest.mark.slow
@pytest.mark.skipif(not cpu_peak_supported(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("name", MODELS)
def test_memory_estimates_are_within_a_factor_of_the_measured_peak(tmp_path, name):
    """The weights (resident before) plus the peak resident memory one step adds (VmHWM, see
    isoprobe.tasks.peak_memory); a step on a copy first, so that the measured one pays for no
    library loaded on first use."""
    overrides = FEW_SAMPLES if model_class(tmp_path, name).samples else []
    model = build(tmp_path, name, overrides=overrides).train()
    batch = memory_batch()
    training_step(copy.deepcopy(model), batch)
    trained = weight_bytes(model) + cpu_peak_bytes(lambda: training_step(model, batch))
    estimate = model.training_memory_bytes(MEMORY_BATCH)
    assert within_factor(estimate, trained), (estimate, trained)

    model = build(tmp_path, name, overrides=overrides)
    with torch.no_grad():
        seeded_forecast(model, batch)
        forecast = weight_bytes(model) + cpu_peak_bytes(lambda: seeded_forecast(model, batch))
    estimate = model.forecast_memory_bytes(MEMORY_BATCH)
    assert within_factor(estimate, forecast), (estimate, forecast)


@pytest.mark.parametrize("name", MODELS)
def test_input_head_and_feed_forward_modules_are_the_models_own_and_no_attention(tmp_path, name):
    model = build(tmp_path, name)
    own = {id(m) for m in model.modules()}
    attention = {
        id(w if w._base is None else w._base)
        for parts in model.attention_weights().values()
        for w in parts.values()
    }
    declared = {
        "input": model.input_modules(),
        "head": model.head_modules(),
        "feed_forward": model.feed_forward_modules(),
    }
    for kind, modules in declared.items():
        parameters = [p for m in modules for p in m.parameters()]
        assert modules and all(id(m) in own for m in modules), kind
        assert parameters and not any(id(p) in attention for p in parameters), kind
    blocks = [block for stack in model.stacks for block in model.stack_blocks(stack)]
    attended = model.attention_weights() if model.attends else blocks
    assert len(declared["feed_forward"]) == len(attended)  # one per block


#: windows long enough that every model's self-attention reads at least two real tokens
#: (TimesFM's 32-step patches)
LONG = 96


def long_batch() -> dict[str, torch.Tensor]:
    """Two fully observed random walks of :data:`LONG` steps (no repeating pattern: equal
    patches would make equal tokens, whose attention no query can change)."""
    g = torch.Generator().manual_seed(7)
    context = torch.randn(2, LONG, generator=g).cumsum(-1) + 20
    zeros = torch.zeros(2)
    target = torch.randn(2, HORIZON, generator=g) + 20
    return {"context": context, "target": target, "loc": zeros, "scale": zeros + 1}


@pytest.mark.parametrize("name", MODELS)
def test_blocks_run_in_order_each_reading_the_last_ones_output(tmp_path, name):
    props.check_block_order(build(tmp_path, name), make_batch())


@pytest.mark.parametrize("name", MODELS)
def test_each_attention_projection_acts_in_its_named_role(tmp_path, name):
    if not model_class(tmp_path, name).attends:
        assert build(tmp_path, name).attention_weights() == {}  # no projection to act
        return
    props.check_projection_roles(build(tmp_path, name, context=LONG), long_batch())


@pytest.mark.parametrize("name", MODELS)
def test_the_head_maps_the_last_blocks_output_to_the_forecast(tmp_path, name):
    props.check_head(build(tmp_path, name).train(), make_batch())


@pytest.mark.parametrize("name", MODELS)
def test_embed_depends_on_the_input_modules_and_nothing_else(tmp_path, name):
    props.check_input_modules(build(tmp_path, name), make_batch())


@pytest.mark.parametrize("name", MODELS)
def test_the_forecast_reads_every_observed_context_step(tmp_path, name):
    props.check_forecast_reads_every_step(build(tmp_path, name), CONTEXT, HORIZON)


def moved_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with every window's observed context and target values moved to their
    neighbours' steps (:func:`swapped_neighbours`)."""
    moved = {key: swapped_neighbours(batch[key]) for key in ("context", "target")}
    return {**batch, **moved}


@pytest.mark.parametrize("name", MODELS)
def test_every_stack_marks_real_only_tokens_that_carry_observed_values(tmp_path, name):
    batch = gapped_batch()
    props.check_real_tokens_at_every_stack(build(tmp_path, name), batch, moved_batch(batch))


@pytest.mark.parametrize("name", MODELS)
def test_the_loss_reads_every_observed_target_step_and_no_missing_one(tmp_path, name):
    props.check_loss_reads_the_target(build(tmp_path, name), gapped_batch())


@pytest.mark.parametrize("name", MODELS)
def test_the_head_list_holds_every_layer_past_the_last_block(tmp_path, name):
    props.check_head_list_is_complete(build(tmp_path, name), make_batch())


#: a horizon past what one call of any model forecasts (Chronos-Bolt's and TimesFM's 64 steps,
#: Time-MoE's largest head of 32, Moirai's 32-step patches), and a shorter one that starts with
#: the same call (at least Time-MoE's largest head, which both then use first)
ROLL_OUT_HORIZONS = (32, 65)
#: the observed steps of the roll-out's windows: few, so that the LLM's prompt fits beside
#: the long horizon's tokens uncut (GPT-2's 512 positions), as it does beside the short one's
ROLL_OUT_OBSERVED = 8


def roll_out_batch(horizon: int) -> dict[str, torch.Tensor]:
    """Two random walks of :data:`ROLL_OUT_OBSERVED` steps, left-padded to the context."""
    g = torch.Generator().manual_seed(7)
    context = torch.randn(2, CONTEXT, generator=g).cumsum(-1) + 20
    context[:, :-ROLL_OUT_OBSERVED] = NAN
    zeros = torch.zeros(2)
    target = torch.linspace(2.0, 9.0, horizon).repeat(2, 1)
    return {"context": context, "target": target, "loc": zeros, "scale": zeros + 1}


def roll_out_models(tmp_path, name: str) -> tuple[ForecastModule, ForecastModule]:
    """The model ``name`` at the short and the long horizon of :data:`ROLL_OUT_HORIZONS` (few
    sample paths)."""
    overrides = FEW_SAMPLES if model_class(tmp_path, name).samples else []
    short, long = (build(tmp_path, name, overrides=overrides, horizon=h) for h in ROLL_OUT_HORIZONS)
    return short, long


def check_roll_out(short: ForecastModule, long: ForecastModule) -> bool:
    """:func:`props.check_forecast_past_one_call` on :func:`roll_out_batch`'s windows; whether
    the long forecast was rolled out."""
    batches = (roll_out_batch(h) for h in ROLL_OUT_HORIZONS)
    return props.check_forecast_past_one_call(short, long, *batches)


@pytest.mark.parametrize("name", MODELS)
def test_a_horizon_longer_than_one_call_is_rolled_out_in_order(tmp_path, name):
    check_roll_out(*roll_out_models(tmp_path, name))


def _reversed_blocks(model: ForecastModule) -> None:
    listed = model.probe_layers
    stacks = props.stacks(model)

    def probe_layers(site: str = "block") -> dict[str, nn.Module]:
        layers = dict(listed(site))
        if site == "block":
            for names in stacks.values():
                modules = [layers[n] for n in names]
                layers.update(zip(names, reversed(modules), strict=True))
        return layers

    model.probe_layers = probe_layers


def _key_named_query(model: ForecastModule) -> None:
    weights = model.attention_weights
    model.attention_weights = lambda: {
        block: {**parts, "q": parts["k"]} for block, parts in weights().items()
    }


def _input_embedding_as_head(model: ForecastModule) -> None:
    model.head_modules = model.input_modules


def _input_modules_without_the_first(model: ForecastModule) -> None:
    modules = model.input_modules
    model.input_modules = lambda: modules()[1:]


def _forecast_without_the_last_steps(model: ForecastModule, dropped: int = 5) -> None:
    forecast = model.forecast

    def without_last(batch):
        context = batch["context"]
        padding = torch.full_like(context[:, :dropped], float("nan"))
        return forecast({**batch, "context": torch.cat([padding, context[:, :-dropped]], 1)})

    model.forecast = without_last


def _last_stack_marked_all_real(model: ForecastModule) -> None:
    masks = model.token_masks
    last = model.stacks[-1]

    def token_masks(batch, layers):
        layers = list(layers)
        identities = model.identify_layers(layers, type(model).__name__)
        found = masks(batch, layers)
        return {
            name: torch.ones_like(mask) if identities[name].stack == last else mask
            for name, mask in found.items()
        }

    model.token_masks = token_masks


def _loss_target_shifted_by_one_step(model: ForecastModule) -> None:
    loss = model.loss

    def shifted(batch):
        target = batch["target"]
        later = torch.cat([target[:, 1:], torch.full_like(target[:, :1], NAN)], dim=1)
        return loss({**batch, "target": later})

    model.loss = shifted


def _head_list_cut_to_its_first_module(model: ForecastModule) -> None:
    heads = model.head_modules
    model.head_modules = lambda: heads()[:1] if len(heads()) > 1 else []


def _roll_out_pieces_out_of_order(model: ForecastModule) -> None:
    forecast = model.forecast
    first = ROLL_OUT_HORIZONS[0]

    def later_first(batch):
        made = forecast(batch)

        def turn(x):
            return torch.cat([x[..., first:], x[..., :first]], dim=-1)

        samples = None if made.samples is None else turn(made.samples)
        return Forecast(turn(made.quantiles), made.levels, turn(made.median), samples)

    model.forecast = later_first


#: each mistake planted into a wrapper (issue 30, part 7; issue 40) and the check that must
#: catch it, with the windows it is checked on
MISTAKES = {
    "blocks listed in reverse": (_reversed_blocks, "block_order"),
    "key under the query's name": (_key_named_query, "projection_roles"),
    "input embedding as the head": (_input_embedding_as_head, "head"),
    "an input module left out": (_input_modules_without_the_first, "input_modules"),
    "forecast drops the last 5 steps": (_forecast_without_the_last_steps, "forecast"),
    "a stack's placeholders marked real": (_last_stack_marked_all_real, "real_tokens"),
    "loss target shifted by one step": (_loss_target_shifted_by_one_step, "loss_target"),
    "a head left out of the list": (_head_list_cut_to_its_first_module, "head_list_is_complete"),
    "roll-out's pieces out of order": (_roll_out_pieces_out_of_order, "roll_out"),
}


def _check(check: str, model: ForecastModule) -> None:
    if check == "projection_roles":
        props.check_projection_roles(model, long_batch())
    elif check == "forecast":
        props.check_forecast_reads_every_step(model, CONTEXT, HORIZON)
    elif check == "head":
        props.check_head(model.train(), make_batch())
    elif check == "real_tokens":
        batch = gapped_batch()
        props.check_real_tokens_at_every_stack(model, batch, moved_batch(batch))
    elif check == "loss_target":
        props.check_loss_reads_the_target(model, gapped_batch())
    else:
        getattr(props, f"check_{check}")(model, make_batch())


def _first_block_masks(model: ForecastModule) -> list[torch.Tensor]:
    """The masks of every stack's first block on :func:`gapped_batch`."""
    firsts = [names[0] for names in props.stacks(model).values()]
    return list(model.token_masks(gapped_batch(), firsts).values())


def _no_mistake_to_plant(model: ForecastModule, name: str, check: str) -> str | None:
    """Why ``check``'s mistake would change nothing in ``model``, or None."""
    heads = {id(p) for m in model.head_modules() for p in m.parameters()}
    inputs = {id(p) for m in model.input_modules() for p in m.parameters()}
    if check == "head" and heads == inputs:
        return f"{name}'s head is its input embedding (tied)"
    if check == "head_list_is_complete" and heads <= inputs:
        # what the loss reaches past the last block is the input embedding's and a norm's
        return f"{name}'s head is tied to its input embedding"
    if check == "projection_roles" and not model.attends:
        return f"{name} has no attention, so no projection to misname"
    if check == "real_tokens":
        planted = copy.copy(model)
        _last_stack_marked_all_real(planted)
        if all(map(torch.equal, _first_block_masks(model), _first_block_masks(planted))):
            return f"{name}'s last stack marks all its positions real already"
    return None


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_planted_mistake_is_caught(tmp_path, name, mistake):
    plant, check = MISTAKES[mistake]
    if check == "roll_out":
        short, long = roll_out_models(tmp_path, name)
        plant(long)
        try:
            rolled_out = check_roll_out(short, long)
        except AssertionError:
            return
        if not rolled_out:
            pytest.skip(f"{name} forecasts the long horizon in one call: no roll-out to plant in")
        pytest.fail("the roll-out's pieces out of order were not caught")
    model = build(tmp_path, name, context=LONG if check == "projection_roles" else CONTEXT)
    reason = _no_mistake_to_plant(model, name, check)
    if reason is not None:
        pytest.skip(f"{reason}: no mistake to plant")
    plant(model)
    with pytest.raises(AssertionError):
        _check(check, model)
