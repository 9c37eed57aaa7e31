"""Attention compression by truncated SVD: the factors on matrices of known spectrum, a
compressed model against the original, save and reload, and task=compress end to end."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch import nn

from isoprobe.models.compression import (
    COMPRESSION_JSON,
    FactoredLinear,
    attention_sizes,
    compress_attention,
    depth_scaled_eps,
    export_compressed,
    factor_at_rank_fraction,
    factorise,
    flow_of_ranks_schedule,
)
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
    """Every attention projection of ``model`` replaced by a rank-``rank`` matrix."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for projections in model.attention_weights().values():
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
