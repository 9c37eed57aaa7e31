"""Attention compression by truncated SVD: the factors on matrices of known spectrum, a
compressed model against the original, save and reload, and task=compress end to end."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from isoprobe.models.compression import (
    FactoredLinear,
    attention_matrices,
    attention_sizes,
    compress_attention,
    depth_scaled_eps,
    factor_at_rank_fraction,
    factorise,
    flow_of_ranks_schedule,
)
from isoprobe.models.compression_files import COMPRESSION_JSON, export_compressed
from isoprobe.tasks import run_task
from isoprobe.tasks.runner import build_model
from tests.conftest import compose_config
from tests.models.test_contract import MODELS, build, make_batch, seeded_forecast

SPECTRUM = torch.tensor([10.0, 5.0, 1.0, 1e-2, 1e-3, 1e-4] + [0.0] * 26, dtype=torch.float64)


def known_linear(seed: int = 0) -> nn.Linear:
    """A 32 x 48 linear layer whose weight has singular values SPECTRUM, with a bias."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(32, 32, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(48, 32, generator=g, dtype=torch.float64))
    linear = nn.Linear(48, 32).double()
    with torch.no_grad():
        linear.weight.copy_(U @ torch.diag(SPECTRUM) @ V.T)
        linear.bias.copy_(torch.randn(32, generator=g, dtype=torch.float64))
    return linear


@pytest.mark.parametrize("eps, rank", [(0.4, 2), (0.05, 3), (5e-4, 4), (5e-5, 5)])
def test_the_factors_keep_the_eps_rank_and_the_error_stays_under_the_first_dropped_value(eps, rank):
    linear = known_linear()
    factored, kept = factorise(linear, eps)
    assert kept == rank and isinstance(factored, FactoredLinear)
    assert factored.down.weight.shape == (rank, 48) and factored.up.weight.shape == (32, rank)
    x = torch.randn(200, 48, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    error = (factored(x) - linear(x)).norm(dim=1)
    bound = SPECTRUM[rank] * x.norm(dim=1)
    assert (error <= bound * (1 + 1e-9) + 1e-12).all()
    assert torch.allclose(factored.weight, linear.weight, atol=float(SPECTRUM[rank]) * 1.0001)


def test_a_factorisation_that_would_not_be_smaller_keeps_the_layer():
    linear = nn.Linear(8, 8)
    same, rank = factorise(linear, 1e-12)
    assert same is linear and rank == 8


def tiny_chronos(tmp_path, checkpoint: str = "scratch"):
    cfg = compose_config(tmp_path, ["model=chronos", f"model.checkpoint={checkpoint}"])
    windows = SimpleNamespace(context_length=32, prediction_length=8, season_length=1, freq="h")
    torch.manual_seed(0)
    return build_model(cfg.model, windows).eval()


def make_low_rank(model, rank: int) -> None:
    """Every attention projection of ``model`` (self- and cross-attention) replaced by a
    rank-``rank`` matrix."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, _, projections in attention_matrices(model, "all"):
            for weight in projections.values():
                out_features, in_features = weight.shape
                a = torch.randn(out_features, rank, generator=g)
                b = torch.randn(rank, in_features, generator=g)
                weight.copy_(a @ b / in_features)


def test_compressing_exactly_low_rank_projections_changes_nothing_beyond_float_tolerance(
    tmp_path,
):
    model = tiny_chronos(tmp_path)
    make_low_rank(model, rank=4)
    batch = make_batch()
    with torch.no_grad():
        before = model.loss(batch)
        reports = compress_attention(model, 1e-4)
        after = model.loss(batch)
    assert {r.status for r in reports} == {"factored"} and {r.rank for r in reports} == {4}
    assert all(isinstance(model.get_submodule(r.module), FactoredLinear) for r in reports)
    assert torch.allclose(before, after, rtol=1e-5)
    before_size, after_size = attention_sizes(reports)
    assert after_size < before_size


def test_a_saved_compressed_model_reloads_through_model_checkpoint_with_identical_forecasts(
    tmp_path,
):
    model = tiny_chronos(tmp_path)
    reports = compress_attention(model, 0.6)
    assert any(r.status == "factored" for r in reports)
    export = tmp_path / "compressed"
    export_compressed(model, reports, str(export))
    reloaded = tiny_chronos(tmp_path, checkpoint=str(export))
    for r in reports:
        if r.status == "factored":
            mine, theirs = model.get_submodule(r.module), reloaded.get_submodule(r.module)
            assert isinstance(theirs, FactoredLinear) and theirs.rank == r.rank
            assert torch.equal(mine.down.weight, theirs.down.weight)
    batch = make_batch()
    torch.manual_seed(3)
    expected = model.forecast(batch)
    torch.manual_seed(3)
    got = reloaded.forecast(batch)
    assert torch.equal(expected.quantiles, got.quantiles)


def test_factors_saved_from_another_shape_are_refused_with_the_module_named(tmp_path):
    model = tiny_chronos(tmp_path)
    reports = compress_attention(model, 0.6)
    export = tmp_path / "compressed"
    export_compressed(model, reports, str(export))
    saved = json.loads((export / COMPRESSION_JSON).read_text())
    first = next(p for p in saved["projections"] if p["status"] == "factored")
    first["in_features"] += 1
    (export / COMPRESSION_JSON).write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=first["module"].replace(".", r"\.")):
        tiny_chronos(tmp_path, checkpoint=str(export))


@pytest.mark.slow
def test_task_compress_writes_the_table_and_loadable_models(tiny_config, tmp_path):
    cfg = tiny_config(
        "task=compress",
        "model.checkpoint=scratch",
        "model.allow_random_weights=true",
        "compress.epsilon=[0.6,0.8]",
        "compress.timed_batches=1",
        "compress.repeats=1",
    )
    results = run_task(cfg)
    table = pd.read_csv(tmp_path / "compression.csv")
    assert table["epsilon"].tolist() == [0.6, 0.8]
    assert (table["attention_size_ratio"] < 1).all()
    assert table["attention_size_ratio"].is_monotonic_decreasing
    assert (table["factored"] > 0).all() and (table["fused"] == 0).all()
    assert [row["epsilon"] for row in results["compression"]] == [0.6, 0.8]
    assert (tmp_path / "compression.png").stat().st_size > 0
    for eps in ("0.6", "0.8"):
        assert (tmp_path / "compressed" / f"eps{eps}" / COMPRESSION_JSON).is_file()


@pytest.mark.parametrize(
    "layers, r_first, r_last, alpha, expected",
    [
        (4, 4, 16, 0.5, [4, 11, 14, 16]),  # 4 + 12 sqrt(l / 3)
        (4, 4, 16, 1.0, [4, 8, 12, 16]),
        (3, 8, 32, 0.0, [32, 32, 32]),  # alpha = 0: the constant-rank contrast (table 3)
        (1, 8, 32, 0.5, [8]),
    ],
)
def test_the_flow_of_ranks_schedule(layers, r_first, r_last, alpha, expected):
    assert flow_of_ranks_schedule(layers, r_first, r_last, alpha) == expected


def test_low_rank_by_design_factors_each_stack_on_the_schedule_and_trains(tmp_path):
    overrides = ["model.low_rank.enabled=true", "model.low_rank.r_first=4"]
    cfg = compose_config(tmp_path, ["model=chronos", "model.checkpoint=scratch", *overrides])
    windows = SimpleNamespace(context_length=32, prediction_length=8, season_length=1, freq="h")
    model = build_model(cfg.model, windows)
    # 4 encoder and 4 decoder blocks, d_model 128: ranks 4 -> 64 by stack, alpha 0.5
    schedule = flow_of_ranks_schedule(4, 4, 64, 0.5)
    for stack in ("encoder", "decoder"):
        for i, rank in enumerate(schedule):
            attention = model.t5.get_submodule(f"{stack}.block.{i}.layer.0.SelfAttention")
            for part in ("q", "k", "v", "o"):
                layer = getattr(attention, part)
                assert isinstance(layer, FactoredLinear) and layer.rank == rank
    loss = model.loss(make_batch())
    loss.backward()
    q = model.t5.encoder.block[0].layer[0].SelfAttention.q
    assert q.down.weight.grad is not None and q.up.weight.grad.abs().sum() > 0


@pytest.mark.slow
def test_a_low_rank_pretraining_exports_a_model_that_reloads_identically(tiny_config, tmp_path):
    results = run_task(
        tiny_config(
            "task=pretrain",
            "model.checkpoint=scratch",
            "model.low_rank.enabled=true",
            "model.low_rank.r_first=4",
        )
    )
    export = results["export_dir"]
    assert (tmp_path / "export" / COMPRESSION_JSON).is_file()
    reloaded = tiny_chronos(tmp_path, checkpoint=export)
    ranks = sorted({r.rank for r in reloaded.compression})
    assert ranks == sorted(set(flow_of_ranks_schedule(4, 4, 64, 0.5)))


def test_factoring_at_a_rank_fraction_factors_every_projection_at_that_rank(tmp_path):
    model = tiny_chronos(tmp_path)
    reports = factor_at_rank_fraction(model, 0.25)
    assert {(r.status, r.rank) for r in reports} == {("factored", 32)}  # d_model 128
    assert attention_sizes(reports) == (len(reports) * 128 * 128, len(reports) * 32 * 256)
    with pytest.raises(ValueError, match="rank fraction"):
        factor_at_rank_fraction(model, 0.0)


def test_depth_scaled_thresholds_compress_early_blocks_harder(tmp_path):
    model = tiny_chronos(tmp_path)
    thresholds = depth_scaled_eps(model, 0.01, early_factor=8.0)
    for stack in ("encoder", "decoder"):
        values = [thresholds[f"{stack}.{i}"] for i in range(4)]
        assert values == pytest.approx([0.08, 0.04, 0.02, 0.01])
    assert set(depth_scaled_eps(model, 0.01, 1.0).values()) == {0.01}


def test_projections_split_from_a_fused_matrix_are_reported_not_replaced(tmp_path):
    cfg = compose_config(tmp_path, ["model=llm", "model.checkpoint=scratch"])
    windows = SimpleNamespace(context_length=32, prediction_length=8, season_length=1, freq="h")
    model = build_model(cfg.model, windows)
    before = {name: type(m) for name, m in model.named_modules()}
    reports = compress_attention(model, 0.5)
    # GPT-2's c_attn holds q, k and v in one matrix; c_proj (o) is a Conv1D, not an nn.Linear
    assert {r.status for r in reports} == {"fused"}
    assert {name: type(m) for name, m in model.named_modules()} == before


@pytest.mark.parametrize("name", MODELS)
def test_every_model_compresses_and_reloads_with_identical_forecasts(tmp_path, name):
    model = build(tmp_path, name)
    if not model.attends:
        # a model without attention has nothing to compress, and says so naming itself
        with pytest.raises(ValueError, match=rf"does not apply to {type(model).__name__}"):
            compress_attention(model, 0.5)
        return
    reports = compress_attention(model, 0.5)
    statuses = {r.status for r in reports}
    # fused projections (GPT-2's c_attn) are reported and kept; every other one is factored
    assert "factored" in statuses or statuses == {"fused"}, statuses
    for r in reports:
        if r.status == "factored":
            assert isinstance(model.get_submodule(r.module), FactoredLinear), r.module
    export = tmp_path / "compressed"
    export_compressed(model, reports, str(export))
    reloaded = build(tmp_path, name, checkpoint=str(export))
    batch = make_batch()
    expected, got = seeded_forecast(model, batch), seeded_forecast(reloaded, batch)
    torch.testing.assert_close(got.quantiles, expected.quantiles, rtol=0, atol=1e-6)


# ----- the paper's rule: every attention matrix, cross-attention too, smaller or not ----------


def truncated_by_hand(weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, int]:
    """W_r = U_r diag(σ_r) V_r^T with σ_i >= eps σ_1 (numpy's SVD, not torch's)."""
    U, S, Vt = np.linalg.svd(weight.detach().double().numpy(), full_matrices=False)
    r = int((S >= eps * S[0]).sum())
    return torch.from_numpy((U[:, :r] * S[:r]) @ Vt[:r]), r


def test_a_truncation_that_is_not_smaller_is_the_dense_rank_r_product_or_kept_on_request():
    # 32 x 48, SPECTRUM's ranks: 5 at 5e-5; 5 (32 + 48) = 400 < 1536 is smaller, so use an
    # 8 x 8 corner of rank 6 (6 x 16 = 96 >= 64: the factors would not be smaller)
    g = torch.Generator().manual_seed(2)
    U, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    spectrum = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.5, 0.2, 1e-4, 1e-5], dtype=torch.float64)
    linear = nn.Linear(8, 8).double()
    with torch.no_grad():
        linear.weight.copy_(U @ torch.diag(spectrum) @ V.T)
    dense, rank = factorise(linear, 0.01, only_if_smaller=False)
    assert rank == 6 and type(dense) is nn.Linear and dense is not linear
    expected = U[:, :6] @ torch.diag(spectrum[:6]) @ V[:, :6].T
    torch.testing.assert_close(dense.weight, expected, rtol=0, atol=1e-12)
    assert torch.equal(dense.bias, linear.bias)
    assert factorise(linear, 0.01, only_if_smaller=True) == (linear, 6)
    # at full rank there is nothing to truncate: the layer itself, whatever the rule
    assert factorise(linear, 1e-9, only_if_smaller=False) == (linear, 8)


@pytest.mark.parametrize("eps", [0.3, 0.6])
def test_the_paper_rule_truncates_every_self_and_cross_attention_matrix(tmp_path, eps):
    model = tiny_chronos(tmp_path)
    original = {
        (block, kind, part): weight.detach().clone()
        for block, kind, parts in attention_matrices(model, "all")
        for part, weight in parts.items()
    }
    reports = compress_attention(model, eps)  # the defaults: attention=all, only_if_smaller=False
    # 4 encoder + 4 decoder self-attentions, 4 decoder cross-attentions, q k v o each
    assert len(reports) == 4 * 12 and sum(r.attention == "cross" for r in reports) == 16
    for r in reports:
        expected, rank = truncated_by_hand(original[(r.block, r.attention, r.projection)], eps)
        assert r.rank == rank and r.status in ("factored", "truncated"), r
        module = model.get_submodule(r.module)
        assert r.status == ("factored" if rank * 256 < 128 * 128 else "truncated"), r
        torch.testing.assert_close(module.weight.double(), expected, rtol=0, atol=1e-5)
    # the cross-attention the decoder applies is the truncated one
    cross = model.t5.decoder.block[2].layer[1].EncDecAttention
    torch.testing.assert_close(
        cross.v.weight.double(),
        truncated_by_hand(original[("decoder.2", "cross", "v")], eps)[0],
        rtol=0,
        atol=1e-5,
    )


def test_self_attention_only_where_smaller_is_the_rule_before_cross_attention(tmp_path):
    """attention=self, only_if_smaller=true: exactly the self-attention projections whose
    factors are smaller are factored; every other parameter is bit-identical."""
    eps = 0.1
    model = tiny_chronos(tmp_path)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # the encoder's self-attention of rank 8, the rest as initialised
        for block in model.t5.encoder.block:
            for part in "qkvo":
                weight = getattr(block.layer[0].SelfAttention, part).weight
                weight.copy_(torch.randn(128, 8, generator=g) @ torch.randn(8, 128, generator=g))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    self_paths = {
        f"t5.{stack}.block.{i}.layer.0.SelfAttention.{part}"
        for stack in ("encoder", "decoder")
        for i in range(4)
        for part in "qkvo"
    }
    smaller = {
        path
        for path in self_paths
        if truncated_by_hand(before[f"{path}.weight"], eps)[1] * 256 < 128 * 128
    }
    assert smaller and smaller != self_paths  # the setting tells the two rules apart
    reports = compress_attention(model, eps, attention="self", only_if_smaller=True)
    assert {r.attention for r in reports} == {"self"}
    assert {r.module for r in reports if r.status == "factored"} == smaller
    assert {r.status for r in reports} == {"factored", "kept"}
    after = dict(model.named_parameters())
    for name, value in before.items():
        if name.rpartition(".")[0] not in smaller:
            assert torch.equal(after[name], value), name


@pytest.mark.parametrize("name", [*MODELS, "llm-t5"])
def test_cross_attention_weights_are_every_encoder_decoder_attention_of_the_model(tmp_path, name):
    """Found independently of the wrappers: every nn.Linear under a module named like a
    cross-attention (T5's EncDecAttention, or 'cross'); encoder-only and decoder-only models
    have none."""
    if name == "llm-t5":
        cfg = compose_config(tmp_path, ["model=llm", "model.checkpoint=scratch", "model.arch=t5"])
        windows = SimpleNamespace(context_length=32, prediction_length=8, season_length=1, freq="h")
        model = build_model(cfg.model, windows)
    else:
        model = build(tmp_path, name)
    found = {
        id(module.weight)
        for path, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and any(key in path.lower() for key in ("encdecattention", "cross"))
    }
    cross = model.cross_attention_weights()
    named = {id(w) for parts in cross.values() for w in parts.values()}
    assert named == found
    assert bool(cross) == (name in ("chronos", "chronos_bolt", "llm-t5"))
    decoder_blocks = [b for b in model.attention_weights() if b.startswith("decoder.")]
    assert list(cross) in ([], decoder_blocks)
    assert all(set(parts) == set("qkvo") for parts in cross.values())


@pytest.mark.slow
def test_bundled_chronos_at_eps_0_1_the_paper_rule_changes_forecasts_the_old_one_does_not(
    tiny_config, tmp_path
):
    """The trial: chronos-t5-mini at ε = 0.1 read WQL ratio 1.000 under the old rule (nothing
    factored) and 1.082 under the paper's (on its test windows; fewer here)."""
    cfg = tiny_config(
        "task=compress",
        "model.checkpoint=bundled",
        "compress.epsilon=0.1",
        "compress.timed_batches=1",
        "compress.repeats=1",
        "compress.save=false",
    )
    results = run_task(cfg)
    (row,) = results["compression"]
    assert row["factored"] + row["truncated"] == 4 * 12  # every matrix has ε-rank < 128 here
    assert row["wql_ratio"] != 1.0
    assert (
        "compress.attention=all, compress.only_if_smaller=false"
        in (tmp_path / "compression.md").read_text()
    )
    # the old rule on the same model: nothing is smaller, so nothing changes at all
    model = tiny_chronos(tmp_path, checkpoint="bundled")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    reports = compress_attention(model, 0.1, attention="self", only_if_smaller=True)
    assert {r.status for r in reports} == {"kept"} and len(reports) == 32
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
