"""A checkpoint that cannot be read gets an error naming the file and what to do, for the
loading paths that raised a library's own exception (SafetensorError, JSONDecodeError,
transformers' "Unrecognized model") or pointed at a reinstall that would not help."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from isoprobe.models.checkpoints import BUNDLED_DIR, SHIPPED, CheckpointError
from isoprobe.tasks.runner import build_model
from tests.conftest import CONFIG_DIR, TINY_MODEL, compose_config


def build(tmp_path, model: str, *overrides: str, lengths=(32, 8)):
    cfg = compose_config(tmp_path, [f"model={model}", *TINY_MODEL.get(model, []), *overrides])
    windows = SimpleNamespace(
        context_length=lengths[0], prediction_length=lengths[1], season_length=1, freq="h"
    )
    return build_model(cfg.model, windows)


def copy_bundled(tmp_path, name: str):
    target = tmp_path / name
    shutil.copytree(BUNDLED_DIR / name, target)
    return target


def test_shipped_names_every_bundled_folder():
    assert sorted(p.name for p in BUNDLED_DIR.iterdir() if p.is_dir()) == sorted(SHIPPED)


def test_truncated_lag_llama_weights_name_the_file(tmp_path):
    target = copy_bundled(tmp_path, "lag-llama-mini")
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"{weights} cannot be read .*truncated"):
        build(tmp_path, "lag_llama", f"model.checkpoint={target}")


@pytest.mark.parametrize(
    ("model", "folder"),
    [("lag_llama", "lag-llama-mini"), ("moirai", "moirai-mini"), ("time_moe", "time-moe-mini")],
)
def test_invalid_config_json_names_the_file(tmp_path, model, folder):
    target = copy_bundled(tmp_path, folder)
    (target / "config.json").write_text('{"n_layer": 2,')
    with pytest.raises(CheckpointError, match=rf"{target / 'config.json'} is not valid JSON"):
        build(tmp_path, model, f"model.checkpoint={target}")


def test_a_moirai_export_given_to_patchtst_says_what_patchtst_loads(tmp_path):
    target = copy_bundled(tmp_path, "moirai-mini")
    with pytest.raises(CheckpointError, match=r"model=patchtst loads PatchTSTForPrediction"):
        build(tmp_path, "patchtst", f"model.checkpoint={target}")


@pytest.mark.parametrize(
    ("folder", "model_type"), [("chronos-t5-mini", "t5"), ("timesfm-mini", "timesfm")]
)
def test_another_architectures_directory_given_to_time_moe_names_its_model_type(
    tmp_path, folder, model_type
):
    target = copy_bundled(tmp_path, folder)
    with pytest.raises(
        CheckpointError, match=rf"not a Time-MoE config \(model_type='{model_type}'.*model=time_moe"
    ):
        build(tmp_path, "time_moe", f"model.checkpoint={target}")


def test_a_bundled_checkpoint_isoprobe_does_not_ship_is_not_a_reinstall(tmp_path):
    with pytest.raises(CheckpointError, match=r"ships no checkpoint 'llm-t5-mini'") as err:
        build(
            tmp_path, "llm", "model.arch=t5", "model.checkpoint=bundled", "model.bundled_name=null"
        )
    assert "einstall" not in str(err.value)
    assert "model.checkpoint=scratch" in str(err.value)


def test_a_shipped_checkpoint_missing_from_the_install_says_reinstall(tmp_path, monkeypatch):
    import isoprobe.models.checkpoints as checkpoints

    monkeypatch.setattr(checkpoints, "BUNDLED_DIR", tmp_path / "empty")
    with pytest.raises(CheckpointError, match=r"installation of isoprobe is incomplete"):
        build(tmp_path, "chronos_bolt", "model.checkpoint=bundled")


@pytest.mark.parametrize("model", sorted(p.stem for p in (CONFIG_DIR / "model").glob("*.yaml")))
def test_scratch_without_sizes_names_the_settings_it_needs(tmp_path, model):
    needs = "model.sizes.gpt2" if model == "llm" else "model.sizes and model.size"
    with pytest.raises(CheckpointError, match=f"model.checkpoint=scratch needs {needs}"):
        build(tmp_path, model, "model.checkpoint=scratch", "model.sizes=null")
