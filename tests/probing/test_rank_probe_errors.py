"""A rank that cannot be computed (diverged weights, non-finite tokens) is an ``error`` row with
the reason; the rank probe never stops a run."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from probe_toy import ToyData, ToyForecaster

from isoprobe.metrics import reference
from isoprobe.metrics.rank import rank_metric
from isoprobe.models.compression import attention_matrices
from isoprobe.probing import ProbeCallback

PROBE_SET = dict(num_windows=8, batch_size=3, max_tokens=60, seed=3)
PROJECTIONS = ("q", "k", "v", "o")


def _diverged_toy() -> ToyForecaster:
    """The toy model with one infinite weight in block 1's output projection: that block's
    tokens and its ``o`` projection are non-finite, everything before it is finite."""
    L.seed_everything(0)
    model = ToyForecaster()
    with torch.no_grad():
        model.blocks[1].self_attn.out_proj.weight[0, 0] = math.inf
    return model


def _by_key(records: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["layer"], r["metric"]): r for r in records}


def test_diverged_tokens_and_weights_give_error_rows_and_the_rest_is_measured(tmp_path):
    model = _diverged_toy()
    probe = ProbeCallback(
        measures=["isotropy", "rank"],
        isotropy={"pca_layers": []},
        output_dir=str(tmp_path),
        **PROBE_SET,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        callbacks=[probe],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.validate(model, datamodule=ToyData(), verbose=False)  # no exception

    rows = _by_key(probe.records_of("rank"))
    tokens_error = rows[("encoder.1", "error")]
    assert math.isnan(tokens_error["value"])
    assert "encoder.1's tokens are NaN or inf" in tokens_error["note"]
    assert ("encoder.1", rank_metric(0.01)) not in rows
    weight_error = rows[("encoder.1.o", "error")]
    assert weight_error["note"] == "1 of 256 entries of encoder.1's o projection are NaN or inf"
    assert ("encoder.1", rank_metric(0.01, "o")) not in rows

    # the finite matrices keep their ranks, equal to the reference on the same weights
    weights = model.attention_weights()
    for block, projections in (("encoder.0", PROJECTIONS), ("encoder.1", ("q", "k", "v"))):
        for p in projections:
            expected = reference.epsilon_rank(weights[block][p].detach().double().numpy(), 0.01)
            assert rows[(block, rank_metric(0.01, p))]["value"] == expected
    for layer in ("embed", "encoder.0"):
        assert rows[(layer, rank_metric(0.01))]["value"] >= 1
    isotropy = probe.records_of("isotropy")
    assert {r["metric"] for r in isotropy if r["layer"] == "encoder.1"} == {"error"}
    assert (tmp_path / "flow_of_ranks" / "epoch0.png").is_file()


class RecurrentToy(ToyForecaster):
    """The toy model declared without attention, as a recurrent model (TiRex) is."""

    attends = False

    def attention_weights(self) -> dict:
        return {}


def test_the_weight_ranks_of_a_model_without_attention_say_they_do_not_apply():
    L.seed_everything(0)
    probe = ProbeCallback(measures=["rank"], **PROBE_SET)
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        callbacks=[probe],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.validate(RecurrentToy(), datamodule=ToyData(), verbose=False)
    rows = _by_key(probe.records_of("rank"))
    row = rows[("weights", "not_applicable")]
    assert math.isnan(row["value"])
    assert row["note"] == (
        "attention_rank does not apply to RecurrentToy: its blocks are recurrent, with no "
        "attention projections"
    )
    assert not any(metric.startswith("rank_q") for _, metric in rows)
    assert ("encoder.1", rank_metric(0.01)) in rows  # the ranks of its tokens still are


def test_compressing_a_model_without_attention_is_refused_by_name():
    with pytest.raises(ValueError, match="compressing attention does not apply to RecurrentToy"):
        attention_matrices(RecurrentToy())
