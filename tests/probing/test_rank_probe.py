"""The rank measures on the toy forecaster: ε-ranks equal the plain definition on the tokens and
weights,
one forward pass shared with the isotropy probe, its files and pictures."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from probe_toy import (
    ToyData,
    ToyForecaster,
    isotropy_probe,
    rank_probe,
    seeded_subsample,
    tokens_by_hand,
    toy_trainer,
)

from isoprobe.metrics import probe_metrics, reference
from isoprobe.metrics.rank import rank_metric
from isoprobe.probing import ProbeCallback
from isoprobe.probing.measure_set import ProbeInputs
from isoprobe.probing.rank import _flow
from isoprobe.probing.records import read_records
from isoprobe.probing.schedule import ProbeTime

PROBE_SET = dict(num_windows=8, batch_size=3, max_tokens=60, seed=3)
EPSILONS = (1e-3, 1e-2, 1e-1)


def _values(records: list[dict]) -> dict[tuple[str, str], float]:
    return {(r["layer"], r["metric"]): r["value"] for r in records}


def test_ranks_equal_the_reference_on_the_collected_tokens_and_the_attention_weights(tmp_path):
    L.seed_everything(0)
    model, data = ToyForecaster(), ToyData()
    probe = rank_probe(epsilons=EPSILONS, output_dir=str(tmp_path), **PROBE_SET)
    toy_trainer([probe]).validate(model, datamodule=data, verbose=False)
    got = _values(probe.records)

    tokens = tokens_by_hand(model, data.val_dataset, probe.window_indices, batch_size=3)
    for layer, X in tokens.items():
        X = seeded_subsample(X, 60, seed=3).double().numpy()
        assert got[(layer, "n_tokens")] == len(X)
        assert got[(layer, "width")] == X.shape[1]
        for eps in EPSILONS:
            assert got[(layer, rank_metric(eps))] == reference.epsilon_rank(X, eps)
    # the projections as the blocks apply them, split from the fused in-projection by hand
    for i, block in enumerate(model.blocks):
        fused = block.self_attn.in_proj_weight.detach().double().numpy()
        width = fused.shape[1]
        weights = {
            "q": fused[:width],
            "k": fused[width : 2 * width],
            "v": fused[2 * width :],
            "o": block.self_attn.out_proj.weight.detach().double().numpy(),
        }
        for p, W in weights.items():
            for eps in EPSILONS:
                assert got[(f"encoder.{i}", rank_metric(eps, p))] == reference.epsilon_rank(W, eps)
    assert len(probe.records) == 3 * (2 + 3) + 2 * 4 * 3


def test_the_isotropy_and_rank_probes_read_one_shared_forward_pass(tmp_path):
    # 8 windows in batches of 3: one collection pass is 3 probe_forward calls
    def calls(callbacks: list) -> int:
        model = ToyForecaster()
        toy_trainer(callbacks).validate(model, datamodule=ToyData(), verbose=False)
        return len(model.probe_calls)

    probe_set = dict(PROBE_SET, output_dir=str(tmp_path))
    both = dict(measures=["isotropy", "rank"], isotropy={"metrics": {"k_max": 4}}, **probe_set)
    assert calls([isotropy_probe(metrics={"k_max": 4}, **probe_set)]) == 3
    # every measure set of the probe reads its one pass
    assert calls([ProbeCallback(**both)]) == 3
    # a second probe callback (another token budget) is a collection of its own
    assert (
        calls([ProbeCallback(**both), rank_probe(name="budget", **{**probe_set, "max_tokens": 50})])
        == 6
    )


def test_a_shared_pass_gives_each_probe_the_tokens_it_would_collect_alone(tmp_path):
    def rank_records(callbacks: list) -> dict:
        L.seed_everything(0)
        model = ToyForecaster()
        toy_trainer(callbacks).validate(model, datamodule=ToyData(), verbose=False)
        (probe,) = callbacks
        return _values(probe.records_of("rank"))

    alone = rank_records([rank_probe(output_dir=str(tmp_path), layers=["encoder.1"], **PROBE_SET)])
    shared = rank_records(
        [
            ProbeCallback(
                measures=["isotropy", "rank"],
                isotropy={"metrics": {"k_max": 4}},
                output_dir=str(tmp_path),
                layers=["encoder.1"],
                **PROBE_SET,
            )
        ]
    )
    assert alone == shared


@pytest.mark.parametrize("every, drawn", [(0, (0, 2)), (1, (0, 1, 2)), (-1, ())])
def test_files_pictures_and_the_trajectory_over_a_fit(tmp_path, every, drawn):
    L.seed_everything(0)
    probe = rank_probe(output_dir=str(tmp_path), figures_every_n_epochs=every, **PROBE_SET)
    toy_trainer([probe], max_epochs=2).fit(ToyForecaster(), datamodule=ToyData())
    assert probe.probed_epochs == [0, 1, 2]
    on_disk = read_records(tmp_path / "rank_metrics.csv")
    assert [r["probe"] for r in on_disk] == ["rank"] * len(probe.records)
    assert all(
        a == b or (math.isnan(a["value"]) and math.isnan(b["value"]))
        for a, b in zip(on_disk, probe.records, strict=True)
    )
    for epoch in (0, 1, 2):
        for folder in ("flow_of_ranks", "spectra"):
            path = tmp_path / folder / f"epoch{epoch}.png"
            assert path.is_file() == (epoch in drawn), path
            assert epoch not in drawn or path.stat().st_size > 0
    assert (tmp_path / "rank_trajectories.png").stat().st_size > 0


@pytest.mark.parametrize("epsilons", [[], [0.0], [1e-2, 2.0]])
def test_thresholds_outside_zero_one_are_refused(epsilons):
    with pytest.raises(ValueError, match="epsilons must be values in"):
        rank_probe(epsilons=epsilons)


def test_weights_false_measures_the_tokens_only(tmp_path):
    probe = rank_probe(weights=False, output_dir=str(tmp_path), **PROBE_SET)
    toy_trainer([probe]).validate(ToyForecaster(), datamodule=ToyData(), verbose=False)
    assert {r["layer"] for r in probe.records} == {"embed", "encoder.0", "encoder.1"}
    assert not any("_q_" in r["metric"] for r in probe.records)
    assert torch.is_grad_enabled()


class CrossToy(ToyForecaster):
    """The toy with a cross-attention beside its last block (only its weights are read)."""

    def __init__(self) -> None:
        super().__init__()
        self.cross = torch.nn.MultiheadAttention(16, 2, batch_first=True)

    def cross_attention_weights(self) -> dict[str, dict[str, torch.Tensor]]:
        q, k, v = self.cross.in_proj_weight.chunk(3, dim=0)
        return {"encoder.1": {"q": q, "k": k, "v": v, "o": self.cross.out_proj.weight}}


def test_cross_attention_projections_get_ranks_flow_panels_and_histograms(tmp_path):
    L.seed_everything(0)
    model = CrossToy()
    with torch.no_grad():  # a known rank: v of rank 3
        a, b = torch.randn(16, 3), torch.randn(3, 16)
        model.cross.in_proj_weight[32:].copy_(a @ b)
    probe = rank_probe(epsilons=EPSILONS, output_dir=str(tmp_path), **PROBE_SET)
    toy_trainer([probe]).validate(model, datamodule=ToyData(), verbose=False)
    got = _values(probe.records)
    fused = model.cross.in_proj_weight.detach().double().numpy()
    weights = {"q": fused[:16], "k": fused[16:32], "v": fused[32:]}
    weights["o"] = model.cross.out_proj.weight.detach().double().numpy()
    for p, W in weights.items():
        for eps in EPSILONS:
            assert got[("encoder.1.cross", rank_metric(eps, p))] == reference.epsilon_rank(W, eps)
    assert got[("encoder.1.cross", rank_metric(1e-3, "v"))] == 3
    # the self-attention rows are as they were: 3 layers x (tokens + 3 ε) + 2 blocks x 4 x 3
    assert len(probe.records) == 3 * (2 + 3) + 2 * 4 * 3 + 4 * 3

    when = ProbeTime(epoch=0, step=0)
    rank = probe.measure_sets["rank"]
    inputs = ProbeInputs(when, tokens={}, window_means={}, model=model, dataset=None, windows=[])
    measurement = rank.measure(inputs)
    panels = _flow(measurement.artefacts)
    assert list(panels) == ["q", "k", "v", "o", "cross q", "cross k", "cross v", "cross o"]
    assert panels["cross v"][1e-3] == [("encoder.1.cross", 3)]
    media = rank.wandb_media("rank", tmp_path, when, measurement.artefacts)
    assert {f"rank/spectrum/encoder.1.cross.{p}" for p in "qkvo"} <= set(media)
    assert (tmp_path / "flow_of_ranks" / "epoch0.png").stat().st_size > 0


def test_token_ranks_are_named_uncentred_and_differ_from_the_centred_rank():
    """Tokens spread in 2 directions around a far-off mean: the token matrix has rank 3, its
    centred spread rank 2. The rank probe's name says which one it reports."""
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(200, 2, generator=g) @ torch.randn(2, 8, generator=g)
    X = spread + 10 * torch.randn(1, 8, generator=g)
    assert rank_metric(1e-3) == "rank_uncentred_eps0.001"
    assert reference.epsilon_rank(X.double().numpy(), 1e-3) == 3
    centred = probe_metrics(X, {"metrics": ["eps_rank_centred"], "rank_eps": 1e-3})
    assert centred == {"eps_rank_centred": 2.0}
