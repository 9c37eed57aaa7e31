"""``model.compile=true``: training with the loss compiled by ``torch.compile`` trains as the
eager step does, and the probe reads the eager modules, so its numbers do not change with the
switch. ``compile_backend=eager`` captures the same graphs as the default ``inductor`` (TorchDynamo
decides which modules run inside the graph, hence whether hooks run) and runs them with eager
kernels: the test then asks for equality to float noise in seconds. Inductor's generated kernels
take minutes to compile on a CPU (docs/benchmarks.md gives its times and its agreement)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from isoprobe.tasks import run_task
from tests.conftest import compose_config, tiny_for

MODEL = "patchtst"
SHORT = [
    "trainer.max_steps=3",
    "++trainer.log_every_n_steps=1",
    "+trainer.limit_val_batches=0",
    "task.evaluate_before=false",
    "task.evaluate_after=false",
    "callbacks.probe.measures=[isotropy]",
]


def _run(directory, *overrides: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    run_task(compose_config(directory, [*tiny_for(MODEL), *SHORT, *overrides]))
    steps = pd.read_csv(directory / "csv" / "metrics.csv")
    losses = steps.dropna(subset=["train/loss"]).set_index("step")["train/loss"]
    probe = pd.read_csv(directory / "probe_metrics.csv", float_precision="round_trip")
    return losses, probe, json.loads((directory / "summary.json").read_text())


def test_a_compiled_training_step_trains_as_the_eager_one_and_the_probe_reads_eager_modules(
    tmp_path,
):
    eager_loss, eager_probe, eager_summary = _run(tmp_path / "eager")
    loss, probe, summary = _run(
        tmp_path / "compiled", "model.compile=true", "model.compile_backend=eager"
    )
    assert len(loss) == 3
    pd.testing.assert_series_equal(loss, eager_loss, rtol=1e-5, atol=0)
    # before training the probe reads the same weights through the same eager modules: equal;
    # after it, the weights agree to the float noise of the steps
    first = probe["global_step"] == 0
    pd.testing.assert_frame_equal(probe[first], eager_probe[first], check_exact=True)
    pd.testing.assert_frame_equal(probe, eager_probe, rtol=1e-4, atol=1e-6)
    assert summary["compile_seconds"] > 0 and "compile_seconds" not in eager_summary


def test_compiling_with_the_isotropy_regulariser_is_refused(tmp_path):
    with pytest.raises(ValueError, match="model.compile=true with the isotropy regulariser"):
        run_task(
            compose_config(
                tmp_path, [*tiny_for(MODEL), *SHORT, "model.compile=true", "regularizer=isotropy"]
            )
        )
