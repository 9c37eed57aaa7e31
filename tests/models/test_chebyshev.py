"""The Chebyshev fixed input embedding of rank k (rank-structure paper appendix I)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from numpy.polynomial import chebyshev

from isoprobe.metrics import reference
from isoprobe.models.chronos.chebyshev import chebyshev_embedding, chebyshev_features
from isoprobe.tasks.runner import build_model
from tests.conftest import compose_config
from tests.models.test_contract import make_batch


def test_the_features_are_numpys_chebyshev_polynomials():
    x = torch.linspace(-1, 1, 101, dtype=torch.float64)
    expected = chebyshev.chebvander(x.numpy(), 6)[:, 1:]  # T_1 .. T_6
    np.testing.assert_allclose(chebyshev_features(x, 6).numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("rank", [1, 3, 8])
def test_the_embedded_values_have_rank_k_and_the_special_tokens_stand_apart(rank):
    values = torch.linspace(-15, 15, 500)
    matrix = chebyshev_embedding(values, rank, width=64, x_max=15.0, seed=0, extra_rows=2)
    assert matrix.shape == (502, 64)
    embedded, special = matrix[2:].double().numpy(), matrix[:2].double().numpy()
    assert reference.epsilon_rank(embedded, 1e-5) == rank
    assert np.abs(special @ embedded.T).max() < 1e-5
    assert reference.epsilon_rank(np.vstack([special, embedded]), 1e-5) == rank + 2


def build_chronos(tmp_path, *overrides: str):
    cfg = compose_config(tmp_path, ["model=chronos", *overrides])
    windows = SimpleNamespace(context_length=32, prediction_length=8, season_length=1, freq="h")
    torch.manual_seed(0)
    return build_model(cfg.model, windows)


def test_chronos_encoder_reads_the_fixed_embedding_and_a_checkpoint_carries_it(tmp_path):
    chebyshev_4 = ["model.input_embedding=chebyshev", "model.chebyshev_rank=4"]
    model = build_chronos(tmp_path, "model.checkpoint=scratch", *chebyshev_4)
    fixed = model.fixed_embedding
    assert reference.epsilon_rank(fixed[2:].double().numpy(), 1e-5) == 4  # after PAD, EOS
    assert not any(p is fixed for p in model.parameters())  # not trained
    assert "fixed_embedding" not in model.state_dict()  # rebuilt from its rank on load

    batch = make_batch()
    ids, _, _ = model._tokenize_context(batch)
    seen = []
    handle = model.embed_tap.register_forward_hook(lambda _m, _i, out: seen.append(out))
    model.loss(batch)
    handle.remove()
    assert torch.equal(seen[0], fixed[ids])

    model.export(str(tmp_path / "export"))
    reloaded = build_chronos(tmp_path, f"model.checkpoint={tmp_path / 'export'}")
    assert torch.equal(reloaded.fixed_embedding, fixed)
    model.eval()
    reloaded.eval()
    torch.manual_seed(1)
    expected = model.forecast(batch)
    torch.manual_seed(1)
    assert torch.equal(reloaded.forecast(batch).quantiles, expected.quantiles)


def test_the_chebyshev_embedding_needs_a_model_trained_from_scratch(tmp_path):
    with pytest.raises(ValueError, match="model.checkpoint=scratch"):
        build_chronos(tmp_path, "model.checkpoint=bundled", "model.input_embedding=chebyshev")
