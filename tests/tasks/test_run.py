"""End-to-end runs of the tasks through the Hydra config, as `python run.py ...` would."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError

from isoprobe.data import UnknownDatasetError
from isoprobe.models.checkpoints import CheckpointError
from isoprobe.tasks import run_task, runner
from tests.conftest import ROOT, TINY, compose_config, wandb_home_env, wandb_records


def probe_csv(run_dir) -> pd.DataFrame:
    return pd.read_csv(run_dir / "probe_metrics.csv")


def test_finetune_probes_before_training_and_every_epoch(tiny_config, tmp_path):
    cfg = tiny_config("trainer.max_epochs=2", "model.checkpoint=scratch")
    results = run_task(cfg)
    records = probe_csv(tmp_path)
    assert sorted(records.epoch.unique()) == [0, 1, 2]
    layers = {"embed", *(f"encoder.{i}" for i in range(4)), *(f"decoder.{i}" for i in range(4))}
    assert set(records.layer) == layers
    # one row per epoch x layer x metric, nothing duplicated
    assert not records.duplicated(["epoch", "layer", "metric"]).any()
    assert records[records.epoch == 0].global_step.eq(0).all()
    for split in ("before", "after"):
        assert {"test/nmse", "test/mase", "test/wql"} <= set(results[split])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["resolved_checkpoint"] == "scratch"
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_bf16_mixed_trains_in_bfloat16_on_the_cpu_and_keeps_float32_weights(
    tiny_config, tmp_path, monkeypatch
):
    """``trainer.precision=bf16-mixed`` (torch.autocast on the CPU): the training steps'
    matrix products run in bfloat16, the weights and the checkpoint stay float32, and the probe
    and the forecast metrics come out finite."""
    training_dtypes = set()
    build_model = runner.build_model

    def recording(model_cfg, datamodule):
        model = build_model(model_cfg, datamodule)
        head = model.t5.lm_head

        def record(module, args, output):
            if module.training:
                training_dtypes.add(output.dtype)

        head.register_forward_hook(record)
        return model

    monkeypatch.setattr(runner, "build_model", recording)
    results = run_task(tiny_config("trainer.precision=bf16-mixed", "model.checkpoint=scratch"))
    assert training_dtypes == {torch.bfloat16}
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert {t.dtype for t in state.values() if t.is_floating_point()} == {torch.float32}
    assert probe_csv(tmp_path).value.notna().all()
    assert all(math.isfinite(results["after"][f"test/{m}"]) for m in ("nmse", "mase", "wql"))


def test_probe_task_measures_the_loaded_model_once_without_training(tiny_config, tmp_path):
    cfg = tiny_config("task=probe", "model.checkpoint=scratch")
    results = run_task(cfg)
    records = probe_csv(tmp_path)
    assert records.epoch.unique().tolist() == [0]
    assert records.global_step.eq(0).all()
    assert "after" not in results and "test/nmse" in results["before"]
    assert not (tmp_path / "checkpoints").exists()
    # the validation pass feeds the probes and logs its loss; the forecast is the test split's
    logged = pd.read_csv(next((tmp_path / "csv").glob("**/metrics.csv"))).columns
    assert "val/loss" in logged and not any(c.startswith("val/nmse") for c in logged)


def test_without_a_logger_the_run_directory_still_holds_the_records(tiny_config, tmp_path):
    results = run_task(tiny_config("task=probe", "model.checkpoint=scratch", "logger=none"))
    # both default probes, each in its own file, every record also in the results
    for probe, csv_name in (("isotropy", "probe_metrics.csv"), ("rank", "rank_metrics.csv")):
        records = [r for r in results["probe_records"] if r["probe"] == probe]
        assert len(pd.read_csv(tmp_path / csv_name)) == len(records) > 0
    assert not (tmp_path / "csv").exists() and not (tmp_path / "wandb").exists()


def test_the_probe_observes_without_changing_training(tmp_path):
    """Eval-mode forwards, its own seeded generators: training and the sampled forecasts after
    it are bit for bit those of a run without the probe."""
    base = [*TINY, "model.checkpoint=scratch", "task.evaluate_before=false"]
    probed = run_task(compose_config(tmp_path / "probed", base))
    unprobed_base = [o for o in base if not o.startswith("callbacks.")]
    unprobed = run_task(compose_config(tmp_path / "unprobed", [*unprobed_base, "callbacks=none"]))
    assert probe_csv(tmp_path / "probed").epoch.unique().tolist() == [0, 1]
    assert not (tmp_path / "unprobed" / "probe_metrics.csv").exists()
    assert probed["after"] == unprobed["after"]


def test_resume_continues_the_trajectory_without_duplicates(tmp_path):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    base = [*TINY, "model.checkpoint=scratch"]
    run_task(compose_config(first_dir, [*base, "trainer.max_epochs=1"]))
    last = first_dir / "checkpoints" / "last.ckpt"
    run_task(compose_config(second_dir, [*base, "trainer.max_epochs=2", f"ckpt_path={last}"]))
    first, second = probe_csv(first_dir), probe_csv(second_dir)
    assert sorted(second.epoch.unique()) == [0, 1, 2]
    assert not second.duplicated(["epoch", "layer", "metric"]).any()
    key = ["epoch", "layer", "metric"]
    merged = first.merge(second, on=key, suffixes=("_first", "_resumed"))
    assert len(merged) == len(first)
    pd.testing.assert_series_equal(
        merged.value_first, merged.value_resumed, check_names=False, rtol=0, atol=0
    )
    state = torch.load(second_dir / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["epoch"] == 1 and state["global_step"] > 0
    # the resumed run reports the zero-shot forecast of the run's start, and keeps it for the next
    summaries = [json.loads((d / "summary.json").read_text()) for d in (first_dir, second_dir)]
    before = summaries[0]["before"]
    assert "test/nmse" in before and summaries[1]["before"] == before
    assert state["isoprobe_run"]["before"] == before
    assert state["isoprobe_run"]["adapt"] == "full"
    other = [*base, "trainer.max_epochs=2", f"ckpt_path={last}", "model.adapt=head_only"]
    with pytest.raises(CheckpointError, match="with model.adapt=full, but this run asks for"):
        run_task(compose_config(tmp_path / "third", other))


@pytest.mark.parametrize(
    "override, option",
    [("model=not_a_model", "model"), ("data=not_a_domain", "data"), ("task=not_a_task", "task")],
)
def test_unknown_group_option_is_a_clear_hydra_error(tmp_path, override, option):
    with pytest.raises(MissingConfigException, match=f"Could not find '{option}/not_a"):
        compose_config(tmp_path, [override])


def test_misspelt_key_is_a_clear_hydra_error(tmp_path):
    with pytest.raises(ConfigCompositionException, match="Could not override 'data.contex_length'"):
        compose_config(tmp_path, ["data.contex_length=96"])


def test_a_removed_required_key_is_named(tmp_path):
    cfg = compose_config(tmp_path, [*TINY, "~data.dataset"])
    with pytest.raises(ConfigAttributeError, match="full_key: data.dataset"):
        run_task(cfg)


def test_unknown_dataset_names_the_known_ones(tiny_config):
    with pytest.raises(UnknownDatasetError, match="vic_elec"):
        run_task(tiny_config("data.dataset=not_a_set"))


def run_py_env(extra: dict | None = None) -> dict[str, str]:
    """The environment of a ``run.py`` subprocess: offline, and with the torch threads of the
    test process (one under pytest-xdist: a run of two threads beside the other worker would
    spin against it on two cores), then ``extra``."""
    env = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PATH": "/usr/bin:/bin"}
    if "OMP_NUM_THREADS" in os.environ:
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    return {**env, **(extra or {})}


def run_py(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python run.py <args>`` offline; fails the test with the end of stderr."""
    command = [sys.executable, "run.py", *args]
    done = subprocess.run(
        command, cwd=ROOT, env=run_py_env(env), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_tiny(run_dir, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python run.py <TINY> <overrides>`` writing to run_dir."""
    return run_py(*TINY, *overrides, f"hydra.run.dir={run_dir}", env=env)


@pytest.mark.slow
def test_run_py_end_to_end_prints_outputs_and_summary_and_none_of_lightnings_noise(tmp_path):
    """The run's own outputs, and none of Lightning's noise: its cloud-logger tip, the
    ``_pytree`` deprecation warning, and a model summary with ``Total FLOPs: 0``
    (isoprobe/tasks/quiet.py)."""
    done = run_tiny(tmp_path, "model.checkpoint=scratch")
    assert f"outputs: {tmp_path}" in done.stdout
    assert "probe metrics per layer, epoch 0 -> epoch 1" in done.stdout
    assert "nmse" in done.stdout
    assert (tmp_path / ".hydra" / "config.yaml").is_file()
    output = done.stdout + done.stderr
    assert "parameters trainable" in output  # the run's own summary of its parameters
    for noise in ("Tip:", "litlogger", "LeafSpec", "FLOPs"):
        assert noise not in output, noise


@pytest.mark.slow
def test_probe_under_ddp_sim_equals_one_process(tmp_path):
    """trainer=ddp_sim (two gloo processes) gives the probe numbers of one process."""
    common = ["task=probe", "model.checkpoint=bundled", "task.evaluate_before=false"]
    run_task(compose_config(tmp_path / "one", [*TINY, *common, "trainer=cpu"]))  # this process
    run_tiny(tmp_path / "two", *common, "trainer=ddp_sim")
    key = ["epoch", "layer", "metric"]
    one, two = probe_csv(tmp_path / "one"), probe_csv(tmp_path / "two")
    merged = one.merge(two, on=key, suffixes=("_one", "_two"), validate="one_to_one")
    assert len(merged) == len(one) == len(two) > 0
    assert (merged.metric == "n_tokens").any() and not (merged.metric == "error").any()
    pd.testing.assert_series_equal(
        merged.value_one, merged.value_two, check_names=False, rtol=1e-9, atol=1e-12
    )


def wandb_history(run_dir) -> tuple[str, list[dict]]:
    """(run id, history rows) of the one offline W&B run under run_dir, via ``wandb leet``."""
    (offline_run,) = (run_dir / "wandb").glob("offline-run-*")
    records = wandb_records(offline_run)
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    return offline_run.name.rsplit("-", 1)[1], history


@pytest.mark.slow
def test_resumed_run_continues_the_same_wandb_run_without_duplicate_epochs(tmp_path):
    env = wandb_home_env(tmp_path)
    common = ["logger=wandb", "model.checkpoint=scratch", "task.evaluate_before=false"]
    run_tiny(tmp_path / "first", *common, "trainer.max_epochs=1", env=env)
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    run_tiny(tmp_path / "second", *common, "trainer.max_epochs=2", f"ckpt_path={last}", env=env)

    first_id, first = wandb_history(tmp_path / "first")
    second_id, second = wandb_history(tmp_path / "second")
    assert first_id == second_id
    probed = [h for h in first + second if "probe/cos_inter/embed" in h]
    assert [h["probe/epoch"] for h in probed] == [0, 1, 2]
    records = probe_csv(tmp_path / "second")
    for h in probed:
        rows = records[(records.epoch == h["probe/epoch"]) & (records.metric == "isoscore")]
        for row in rows.itertuples():
            assert float(h[f"probe/isoscore/{row.layer}"]) == pytest.approx(row.value, rel=1e-12)


@pytest.mark.slow
def test_multirun_gives_every_job_its_directory_and_wandb_run(tmp_path):
    env = wandb_home_env(tmp_path)
    sweep = ["-m", "data=energy,weather", *TINY, "task=probe", "model.checkpoint=scratch"]
    run_py(*sweep, "logger=wandb", f"hydra.sweep.dir={tmp_path}", env=env)
    ids = set()
    for job, dataset in enumerate(("vic_elec", "seattle_weather")):
        summary = json.loads((tmp_path / str(job) / "summary.json").read_text())
        assert summary["data_report"]["windows"]["val"] > 0
        assert (tmp_path / str(job) / "probe_metrics.csv").is_file()
        (offline_run,) = (tmp_path / str(job) / "wandb").glob("offline-run-*")
        ids.add(offline_run.name.rsplit("-", 1)[1])
        config = OmegaConf.load(tmp_path / str(job) / ".hydra" / "config.yaml")
        assert config.data.dataset == dataset
    assert len(ids) == 2


def test_probe_runs_on_your_own_csv(tmp_path):
    times = pd.date_range("2024-01-01", periods=300, freq="h")
    values = torch.randn(300, generator=torch.Generator().manual_seed(0)).cumsum(0).numpy()
    path = tmp_path / "mine.csv"
    pd.DataFrame({"timestamp": times, "target": values}).to_csv(path, index=False)
    overrides = ["data=local", f"data.path={path}", "data.context_length=48"]
    overrides += ["data.prediction_length=12", "task=probe", "model.checkpoint=scratch"]
    results = run_task(compose_config(tmp_path / "run", [*TINY, *overrides]))
    assert results["data_report"]["series_total"] == 1
    assert "test/mase" in results["before"]
    assert probe_csv(tmp_path / "run").epoch.unique().tolist() == [0]


def test_a_probe_set_to_null_is_switched_off(tiny_config, tmp_path):
    base = ("task=probe", "model.checkpoint=scratch")
    results = run_task(tiny_config(*base, "callbacks.probe.measures=[rank]"))
    assert {r["probe"] for r in results["probe_records"]} == {"rank"}
    assert not (tmp_path / "probe_metrics.csv").exists()
    (tmp_path / "rank_metrics.csv").unlink()
    results = run_task(tiny_config(*base, "callbacks.probe=null"))
    assert results["probe_records"] == [] and "test/nmse" in results["before"]
    assert not (tmp_path / "rank_metrics.csv").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("callbacks.probe.layers=[]", r"layers=\[\] probes nothing"),
        ("callbacks.probe.isotropy.metrics.metrics=[]", r"no probe metric chosen"),
    ],
)
def test_a_probe_that_would_measure_nothing_is_refused(tiny_config, override, message):
    with pytest.raises(Exception, match=message):
        run_task(tiny_config(override, "task=probe", "model.checkpoint=scratch"))


def test_probe_task_on_a_checkpoint_probes_its_weights_at_its_epoch(tmp_path):
    base = [*TINY, "model.checkpoint=scratch", "logger=none"]
    finetune = run_task(compose_config(tmp_path / "finetune", [*base, "trainer.max_epochs=2"]))
    last = tmp_path / "finetune" / "checkpoints" / "last.ckpt"
    probed = run_task(
        compose_config(tmp_path / "probe", [*base, "task=probe", f"ckpt_path={last}"])
    )
    trained, zero_shot = probe_csv(tmp_path / "finetune"), probe_csv(tmp_path / "probe")
    assert zero_shot.epoch.unique().tolist() == [2]
    assert (
        zero_shot.global_step.unique().tolist()
        == trained[trained.epoch == 2].global_step.unique().tolist()
    )
    key = ["epoch", "layer", "metric"]
    merged = trained.merge(zero_shot, on=key, suffixes=("_trained", "_probed"))
    assert len(merged) == len(zero_shot) > 0
    pd.testing.assert_series_equal(
        merged.value_trained, merged.value_probed, check_names=False, rtol=0, atol=0
    )
    assert "test/nmse" in probed["before"] and "test/nmse" in finetune["after"]


def train_losses(run_dir) -> pd.Series:
    """Training loss by step from the run's csv/metrics.csv."""
    rows = pd.read_csv(run_dir / "csv" / "metrics.csv")
    rows = rows[rows["train/loss"].notna()]
    return rows.set_index("step")["train/loss"]


@pytest.mark.slow
@pytest.mark.parametrize("adapt", ["full", "lora"])
def test_a_run_resumed_in_a_new_process_equals_an_uninterrupted_one(tmp_path, adapt):
    common = ["model.checkpoint=scratch", "task.evaluate_before=false", "task.evaluate_after=false"]
    common += ["trainer.log_every_n_steps=1", f"model.adapt={adapt}"]
    common += ["model.allow_random_weights=true"]
    # the uninterrupted run and the first part in this process, the rest in a new one
    run_task(compose_config(tmp_path / "whole", [*TINY, *common, "trainer.max_epochs=2"]))
    run_task(compose_config(tmp_path / "first", [*TINY, *common, "trainer.max_epochs=1"]))
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    run_tiny(tmp_path / "resumed", *common, "trainer.max_epochs=2", f"ckpt_path={last}")

    whole, resumed = train_losses(tmp_path / "whole"), train_losses(tmp_path / "resumed")
    assert len(resumed) > 0 and resumed.index.min() > train_losses(tmp_path / "first").index.max()
    pd.testing.assert_series_equal(whole.loc[resumed.index], resumed, rtol=0, atol=0)
    key = ["epoch", "layer", "metric"]
    merged = probe_csv(tmp_path / "whole").merge(probe_csv(tmp_path / "resumed"), on=key)
    assert set(merged.epoch) == {0, 1, 2}
    pd.testing.assert_series_equal(
        merged.value_x, merged.value_y, check_names=False, rtol=0, atol=0
    )
    weights = [
        torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        for run in ("whole", "resumed")
    ]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert any(".lora_B." in k for k in weights[0]) == (adapt == "lora")


def test_resuming_on_other_data_is_refused_unless_allowed(tmp_path):
    base = [*TINY, "model.checkpoint=scratch", "logger=none", "task.evaluate_before=false"]
    evaluated = [o for o in base if o != "task.evaluate_before=false"]  # the first part's too
    assert "before" in run_task(compose_config(tmp_path / "first", evaluated))
    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    changed = [*base, "trainer.max_epochs=2", f"ckpt_path={last}", "data.dataset=epf_prices"]
    with pytest.raises(CheckpointError, match="data.dataset: 'vic_elec' -> 'epf_prices'"):
        run_task(compose_config(tmp_path / "second", changed))
    with pytest.raises(CheckpointError, match="data.context_length: 144 -> 96"):
        run_task(compose_config(tmp_path / "third", [*changed[:-1], "data.context_length=96"]))
    allowed = [o for o in changed if o != "task.evaluate_before=false"]
    allowed += ["resume_allow_data_change=true", "task.evaluate_after=false"]
    resumed = run_task(compose_config(tmp_path / "fourth", allowed))
    assert sorted(probe_csv(tmp_path / "fourth").epoch.unique()) == [0, 1, 2]
    assert "before" not in resumed  # the first part's zero-shot forecast was of other data


def test_a_run_that_cannot_fit_in_memory_is_refused_before_anything_runs(tiny_config, tmp_path):
    cfg = tiny_config("data.context_length=2000", "data.batch_size=512", "model.checkpoint=scratch")
    with pytest.raises(MemoryError, match=r"one training step needs about \d+\.\d GiB"):
        run_task(cfg)
    assert not (tmp_path / "checkpoints").exists()
    # scratch: a loaded checkpoint reads only its own context length (128 for the bundled one)
    cfg = tiny_config(
        "data.context_length=2000",
        "data.eval_batch_size=4096",
        "task=probe",
        "model.checkpoint=scratch",
    )
    with pytest.raises(MemoryError, match=r"forecasting one evaluation batch needs about"):
        run_task(cfg)
    assert not (tmp_path / "probe_metrics.csv").exists()


@pytest.mark.slow
def test_a_killed_run_loses_no_probed_epoch_from_wandb_and_resumes_without_duplicates(tmp_path):
    """SIGKILL right after the first epoch's checkpoint: W&B holds every epoch the checkpoint
    holds, and the resumed run adds exactly the epochs after it."""
    env = wandb_home_env(tmp_path)
    common = [*TINY, "logger=wandb", "model.checkpoint=scratch", "data.max_train_windows=256"]
    common += ["task.evaluate_before=false", "task.evaluate_after=false", "trainer.max_epochs=3"]
    first = tmp_path / "first"
    command = [sys.executable, "run.py", *common, f"hydra.run.dir={first}"]
    process = subprocess.Popen(
        command, cwd=ROOT, env=run_py_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    checkpoint = first / "checkpoints" / "epoch_000.ckpt"
    deadline = time.monotonic() + 300
    while not checkpoint.exists():
        assert process.poll() is None and time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()

    state = torch.load(checkpoint, weights_only=True)
    (probe_state,) = [s for k, s in state["callbacks"].items() if "ProbeCallback" in k]
    saved = sorted({int(r["epoch"]) for r in probe_state["records"]["isotropy"]})
    assert saved == [0, 1]
    _, history = wandb_history(first)
    # the probe's metric rows (the end-of-fit trajectory image's row carries probe/epoch too)
    killed = [h["probe/epoch"] for h in history if "probe/cos_inter/embed" in h]
    assert killed == saved

    second = tmp_path / "second"
    run_py(*common, f"hydra.run.dir={second}", f"ckpt_path={checkpoint}", env=env)
    _, history = wandb_history(second)
    resumed = [h["probe/epoch"] for h in history if "probe/cos_inter/embed" in h]
    assert killed + resumed == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "site, tokens, encoder_tokens, decoder_tokens",
    [
        ("block", "real", 8 * 144, 8 * 48),  # observed context values; targets after the start
        ("attention", "all", 8 * 145, 8 * 49),  # every position: EOS and the start token too
    ],
)
def test_probe_site_and_tokens_choose_the_layers_and_positions(
    tiny_config, tmp_path, site, tokens, encoder_tokens, decoder_tokens
):
    options = [f"callbacks.probe.site={site}", f"callbacks.probe.tokens={tokens}"]
    options += ["callbacks.probe.max_tokens=5000", "task=probe", "model.checkpoint=scratch"]
    run_task(tiny_config(*options, "task.evaluate_before=false"))
    counts = probe_csv(tmp_path).query("metric == 'n_tokens'").set_index("layer").value
    suffix = ".attn" if site == "attention" else ""
    encoder = [f"encoder.{i}{suffix}" for i in range(4)]
    decoder = [f"decoder.{i}{suffix}" for i in range(4)]
    assert set(counts.index) == set(encoder + decoder) | ({"embed"} if site == "block" else set())
    assert (counts[encoder] == encoder_tokens).all() and (counts[decoder] == decoder_tokens).all()


def test_two_probes_share_one_trainer_and_one_checkpoint(tiny_config, tmp_path):
    second = "+callbacks.attention"
    options = [f"{second}._target_=isoprobe.probing.ProbeCallback", f"{second}.name=attention"]
    options += [f"{second}.site=attention", f"{second}.measures=[isotropy]"]
    options += [f"{second}.output_dir={tmp_path}", f"{second}.num_windows=8"]
    options += [f"{second}.max_tokens=300"]
    options += [f"{second}.isotropy={{metrics:{{metrics:[cos_inter,eff_dim]}}}}"]
    results = run_task(tiny_config(*options, "model.checkpoint=scratch", "logger=none"))
    by_probe = pd.DataFrame(results["probe_records"]).groupby("probe").layer.unique()
    assert set(by_probe["isotropy"]) >= {"embed", "encoder.0"}
    assert all(layer.endswith(".attn") for layer in by_probe["attention_isotropy"])
    assert (tmp_path / "probe_metrics.csv").is_file()
    on_disk = pd.read_csv(tmp_path / "attention_probe_metrics.csv")
    assert set(on_disk.probe) == {"attention_isotropy"}
    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    keys = {k for k in state["callbacks"] if k.startswith("ProbeCallback")}
    assert keys == {"ProbeCallback{'name': 'probe'}", "ProbeCallback{'name': 'attention'}"}
