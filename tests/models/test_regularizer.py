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
from isoprobe.tasks import run_task
from tests.conftest import compose_config, tiny_for


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
    tiny = [o for o in tiny_for("chronos") if not o.startswith("callbacks.isotropy.")]
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
