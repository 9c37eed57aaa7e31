"""Every configs/model/*.yaml fine-tunes with every ``model.adapt`` strategy through the runner,
as `python run.py model=<name> model.adapt=<strategy>` would: exactly the parameters the strategy
trains change (the frozen ones stay bit-identical), and the run reports how many train."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest
import torch
from lightning.pytorch import Callback

from isoprobe.models.adaptation import ADAPT_CHOICES, check_adapt_needs_weights
from isoprobe.tasks import run_task
from tests.conftest import CONFIG_DIR, ROOT, compose_config, tiny_for

MODELS = sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml"))
#: two optimiser steps (LoRA's A gets its first gradient at the second, once B is non-zero);
#: only the checkpoint callback, no evaluation, no validation
SHORT = [
    "model.checkpoint=scratch",
    "model.allow_random_weights=true",
    "data.max_train_windows=32",
    "trainer.max_steps=2",
    "+trainer.limit_val_batches=0",
    "task.evaluate_before=false",
    "task.evaluate_after=false",
    "logger=none",
    "~callbacks.probe",
    "+callbacks.initial._target_=tests.tasks.test_adaptation_runs.InitialParameters",
    "+callbacks.initial.path=${paths.output_dir}/initial.pt",
]

#: an attention over one position (the softmax of one score is 1) gives its q and k no
#: gradient, so their LoRA B stays at its zero start: Chronos-Bolt's one-step decoder and
#: Chronos-2's group attention (every window its own group)
NO_GRADIENT = re.compile(
    r"^model\.(decoder\.block\.\d+\.layer\.0\.SelfAttention|encoder\.block\.\d+\.layer\.1\."
    r"self_attention)\.[qk]\.lora_B\."
)


class InitialParameters(Callback):
    """Saves every parameter and whether it trains to ``path``, as training starts."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        parameters = pl_module.named_parameters(remove_duplicate=False)
        torch.save(
            {name: (p.detach().clone(), p.requires_grad) for name, p in parameters}, self.path
        )


@pytest.mark.slow
@pytest.mark.parametrize("adapt", ADAPT_CHOICES)
@pytest.mark.parametrize("name", MODELS)
def test_fine_tuning_changes_exactly_what_the_strategy_trains(
    tiny_config, tmp_path, caplog, name, adapt
):
    with caplog.at_level(logging.INFO, logger="isoprobe.tasks.runner"):
        results = run_task(tiny_config(*SHORT, f"model.adapt={adapt}", model=name))
    initial = torch.load(tmp_path / "initial.pt", weights_only=True)
    final = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    trained = {n for n, (_, trains) in initial.items() if trains}
    changed = {n for n, (before, _) in initial.items() if not torch.equal(before, final[n])}
    assert trained and changed <= trained  # the frozen parameters are bit-identical
    assert all(NO_GRADIENT.match(n) for n in trained - changed), sorted(trained - changed)
    if adapt == "lora":
        assert all(".lora_A." in n or ".lora_B." in n for n in trained)
    counts = {k: results[k] for k in ("trainable_parameters", "total_parameters")}
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {k: summary[k] for k in counts} == counts
    logged = f"model.adapt={adapt}: {counts['trainable_parameters']} of "
    assert logged + f"{counts['total_parameters']} parameters trainable" in caplog.text
    assert 0 < counts["trainable_parameters"] <= counts["total_parameters"]
    if adapt != "full":
        assert counts["trainable_parameters"] < counts["total_parameters"]


def test_the_strategies_study_sweeps_every_strategy_fine_tuning(tmp_path):
    cfg = compose_config(tmp_path, ["experiment=adaptation/strategies"])
    params = cfg.hydra.sweeper.params
    assert params["model.adapt"].split(",") == list(ADAPT_CHOICES)
    assert len(params["data"].split(",")) > 1
    assert cfg.task.name == "finetune" and "analyze" in cfg.hydra.callbacks


@pytest.mark.slow
def test_the_strategies_study_ends_with_its_report(tmp_path):
    """Two strategies on one domain, tiny: the sweep, then task=analyze on it."""
    tiny = [o for o in tiny_for("chronos2") if not o.startswith("model=")]
    sweep = tmp_path / "sweep"
    command = [sys.executable, str(ROOT / "run.py"), "-m", "experiment=adaptation/strategies"]
    command += ["model.adapt=lora,head_only", "data=energy", *tiny, f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    assert len(summaries) == 2
    assert all(s["trainable_parameters"] < s["total_parameters"] for s in summaries)
    assert (sweep / "analysis" / "report.html").is_file()


def test_compressing_a_lora_model_is_refused(tiny_config):
    with pytest.raises(ValueError, match="task=compress .* model.adapt=full"):
        run_task(tiny_config("task=compress", "model.adapt=lora"))


@pytest.mark.parametrize("adapt", [a for a in ADAPT_CHOICES if a != "full"])
@pytest.mark.parametrize("name", MODELS)
def test_adapting_random_weights_is_refused_before_anything_loads(
    tiny_config, monkeypatch, name, adapt
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the settings were checked")

    monkeypatch.setattr("isoprobe.tasks.runner.build_model", no_model)
    cfg = tiny_config("model.checkpoint=scratch", f"model.adapt={adapt}", model=name)
    expected = (
        rf"model.adapt={adapt} with model.checkpoint=scratch would train .* randomly "
        r"initialised model .*model.checkpoint=bundled .*model.adapt=full.*"
        r"model.allow_random_weights=true"
    )
    with pytest.raises(ValueError, match=expected):
        run_task(cfg)


def test_patchtst_by_default_is_random_weights_and_refuses_head_only(tiny_config):
    """The trial: `model=patchtst model.adapt=head_only`, whose checkpoint defaults to scratch."""
    with pytest.raises(ValueError, match="model.adapt=head_only with model.checkpoint=scratch"):
        run_task(tiny_config("model.adapt=head_only", model="patchtst"))


def test_compressing_random_weights_is_refused(tiny_config):
    with pytest.raises(ValueError, match=r"task=compress with model.checkpoint=scratch .*bundled"):
        run_task(tiny_config("task=compress", model="patchtst"))


@pytest.mark.parametrize(
    "task, settings, ckpt_path",
    [
        ("finetune", {"checkpoint": "scratch", "adapt": "full"}, None),  # trains every weight
        ("finetune", {"checkpoint": "bundled", "adapt": "lora"}, None),
        ("finetune", {"checkpoint": "scratch", "adapt": "lora"}, "last.ckpt"),  # a resume
        ("probe", {"checkpoint": "scratch", "adapt": "head_only"}, None),  # nothing trains
        ("compress", {"checkpoint": "auto", "adapt": "full"}, None),
        (
            "finetune",
            {"checkpoint": "scratch", "adapt": "lora", "allow_random_weights": True},
            None,
        ),
    ],
)
def test_what_does_not_adapt_random_weights_is_not_refused(task, settings, ckpt_path):
    check_adapt_needs_weights(task, task in ("finetune", "pretrain"), settings, ckpt_path)
