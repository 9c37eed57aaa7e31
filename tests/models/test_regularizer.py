"""The isotropy regulariser: its penalties against numpy, and its place in the training loss."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from isoprobe.models.regularizer import (
    IsotropyRegularizer,
    cos_inter_penalty,
    covariance_penalty,
)
from isoprobe.probing.capture import capture_outputs
from isoprobe.tasks import run_task
from tests.conftest import compose_config, tiny_for
from tests.models.test_contract import MODELS, build, make_batch


def anisotropic(n: int = 40, d: int = 12, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) * np.linspace(0.2, 3.0, d) + 2.0  # a shared mean direction


def test_cos_inter_penalty_is_the_mean_cosine_over_pairs_of_distinct_tokens():
    x = anisotropic()
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    cosines = unit @ unit.T
    expected = cosines[~np.eye(len(x), dtype=bool)].mean()
    assert cos_inter_penalty(torch.tensor(x)).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", [40, 5])  # more tokens than width, and fewer
def test_covariance_penalty_is_the_normalised_spectrums_distance_from_flat(n):
    x = anisotropic(n=n)
    eigenvalues = np.linalg.eigvalsh(np.cov(x, rowvar=False, bias=True))
    expected = (eigenvalues**2).sum() / eigenvalues.sum() ** 2 - 1 / x.shape[1]
    assert covariance_penalty(torch.tensor(x)).item() == pytest.approx(expected, rel=1e-9)


def test_both_penalties_vanish_on_an_isotropic_cloud_and_fall_under_gradient_descent():
    d = 6
    isotropic = torch.cat([torch.eye(d), -torch.eye(d)]).double()
    assert covariance_penalty(isotropic).item() == pytest.approx(0.0, abs=1e-15)
    assert cos_inter_penalty(isotropic).item() == pytest.approx(-1 / (2 * d - 1), abs=1e-15)
    for penalty in (cos_inter_penalty, covariance_penalty):
        x = torch.tensor(anisotropic(), requires_grad=True)
        start = penalty(x).item()
        optimiser = torch.optim.Adam([x], lr=0.1)
        for _ in range(20):
            optimiser.zero_grad()
            penalty(x).backward()
            optimiser.step()
        assert penalty(x).item() < 0.5 * start


def test_last_means_the_last_block_of_each_stack(tiny_config):
    from hydra.utils import instantiate

    from isoprobe.tasks.runner import build_model

    cfg = tiny_config("model.checkpoint=scratch")
    datamodule = instantiate(cfg.data)
    datamodule.setup("fit")
    model = build_model(cfg.model, datamodule)
    layers = cfg.model.sizes[cfg.model.size].num_layers - 1
    assert IsotropyRegularizer(0.1).layer_names(model) == [f"encoder.{layers}", f"decoder.{layers}"]
    with pytest.raises(KeyError, match="unknown .* layer 'encoder.99'"):
        IsotropyRegularizer(0.1, layers=["encoder.99"]).layer_names(model)
    with pytest.raises(ValueError, match="regularizer.penalty must be one of"):
        IsotropyRegularizer(0.1, penalty="entropy")


def finetune(tmp_path, *overrides: str) -> dict:
    tiny = [o for o in tiny_for("chronos") if not o.startswith("callbacks.")]
    cfg = compose_config(
        tmp_path, [*tiny, "model.checkpoint=scratch", "callbacks=none", *overrides]
    )
    return run_task(cfg)


def test_weight_zero_trains_exactly_as_without_and_a_weight_changes_training(tmp_path):
    plain = finetune(tmp_path / "plain")
    zero = finetune(tmp_path / "zero", "regularizer=isotropy", "regularizer.weight=0")
    strong = finetune(
        tmp_path / "strong",
        "regularizer=isotropy",
        "regularizer.weight=5",
        "trainer.log_every_n_steps=1",
    )
    assert zero["after"] == plain["after"]
    assert strong["after"] != plain["after"]
    logged = pd.read_csv(next((tmp_path / "strong" / "csv").glob("**/metrics.csv")))
    assert logged["train/reg"].notna().any() and "train/loss" in logged


#: the models the contract builds (tests/models/test_contract.py), the T5 LLM, and TimesFM
#: forecasting in two decoding steps (its loss runs every block twice)
REGULARISED = [
    *(pytest.param(name, (), id=name) for name in MODELS),
    pytest.param("llm", ("model.arch=t5",), id="llm-t5"),
    pytest.param("timesfm", ("model.sizes.mini.horizon_length=4",), id="timesfm-two-steps"),
]


def regularised_model(tmp_path, name: str, overrides: tuple[str, ...]):
    return build(tmp_path, name, overrides=overrides)


@pytest.mark.parametrize("name, overrides", REGULARISED)
def test_the_regulariser_penalises_the_tokens_the_probe_measures(tmp_path, name, overrides):
    """Every block's tokens the regulariser takes from the training forward (its
    ``training_token_masks``) are the rows the probe collects from ``probe_forward`` (its
    ``token_masks``), in the same order."""
    model = regularised_model(tmp_path, name, overrides).eval()
    layers = list(model.probe_layers("block"))
    regularizer = IsotropyRegularizer(1.0, layers=layers)
    batch = make_batch()
    with torch.no_grad():
        with regularizer.capture(model) as trained:
            model.loss(batch)
        with capture_outputs(model.probe_layers("block")) as probed:
            model.probe_forward(batch)
    training_masks = model.training_token_masks(batch, layers)
    probe_masks = model.token_masks(batch, layers)
    for layer in layers:
        penalised = trained[layer][training_masks[layer]]
        measured = probed[layer][0][probe_masks[layer]]
        assert penalised.shape == measured.shape and len(measured) > 0, layer
        torch.testing.assert_close(penalised, measured, rtol=1e-4, atol=1e-5, msg=layer)


def step_gradients(model, batch, regularizer) -> list[torch.Tensor]:
    model.regularizer = regularizer
    model.zero_grad()
    torch.manual_seed(1)  # the same dropout draws with and without the penalty
    loss = model.training_step(batch, 0)
    assert torch.isfinite(loss)
    loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
@pytest.mark.parametrize("penalty", ["cos_inter", "covariance"])
@pytest.mark.parametrize("name, overrides", REGULARISED)
def test_a_training_step_with_the_regulariser_is_finite_and_the_penalty_moves_it(
    tmp_path, name, overrides, penalty
):
    """One training step of every model with each penalty on its last blocks: a finite loss,
    finite gradients, and gradients other than the task loss's alone."""
    model = regularised_model(tmp_path, name, overrides).train()
    batch = make_batch()
    plain = step_gradients(model, batch, None)
    regularised = step_gradients(model, batch, IsotropyRegularizer(1.0, penalty))
    assert len(plain) == len(regularised)
    assert all(torch.isfinite(g).all() for g in regularised)
    assert any(not torch.equal(a, b) for a, b in zip(plain, regularised, strict=True))
