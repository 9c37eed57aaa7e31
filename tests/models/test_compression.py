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
    export_compressed,
    factorise,
)
from isoprobe.tasks import run_task
from isoprobe.tasks.runner import build_model
from tests.conftest import compose_config
from tests.models.test_contract import make_batch

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
