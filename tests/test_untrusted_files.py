"""Every path that reads a file a user can be handed runs no code from it.

Each test hands isoprobe a file that would create a marker file if its code ran (a pickle that
calls ``Path.touch``, a config that names a callable, a config that asks for remote code) and
checks that the marker is never created and that the error names what was refused."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import re
import shutil
from dataclasses import dataclass
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.feather
import pyarrow.parquet
import pytest
import torch
from safetensors.torch import load_file

from isoprobe.data.local import LocalDataError, load_local
from isoprobe.models.checkpoints import BUNDLED_DIR, CheckpointError
from isoprobe.probing.window_means import WindowMeansError, read_window_means
from isoprobe.tasks.resume import read_checkpoint
from isoprobe.tasks.runner import build_model
from tests.conftest import TINY_MODEL, compose_config
from tests.models.published import built_model

#: configs/model name -> the bundled folder whose config.json a payload directory copies
TRANSFORMERS_MODELS = {
    "chronos": "chronos-t5-mini",
    "chronos_bolt": "chronos-bolt-mini",
    "chronos2": "chronos-2-mini",
    "patchtst": "patchtst-mini",
    "timesfm": "timesfm-mini",
    "llm": "llm-gpt2-mini",
}


def touch_marker(path: str) -> None:
    """What a hostile file's code does here: it creates a file."""
    pathlib.Path(path).touch()


#: how a refusal names the payload's global
REFUSED = re.escape(f"{touch_marker.__module__}.{touch_marker.__name__}")


class TouchOnLoad:
    """Unpickling this calls :func:`touch_marker`, a global every refusal must name."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return touch_marker, (str(self.marker),)


def payload(marker: pathlib.Path) -> bytes:
    """The pickle of :class:`TouchOnLoad`, in protocol 2 as ``torch.save`` writes."""
    return pickle.dumps(TouchOnLoad(marker), protocol=2)


#: the window lengths a bundled model must be built with (PatchTST's head fixes both)
LENGTHS = {"patchtst": (512, 64)}


def build(tmp_path, model: str, checkpoint: str):
    cfg = compose_config(
        tmp_path, [f"model={model}", *TINY_MODEL.get(model, []), f"model.checkpoint={checkpoint}"]
    )
    context, horizon = LENGTHS.get(model, (32, 8))
    windows = SimpleNamespace(
        context_length=context, prediction_length=horizon, season_length=1, freq="h"
    )
    return build_model(cfg.model, windows)


def bundled_copy(tmp_path, folder: str, keep=("config.json",)) -> pathlib.Path:
    """A checkpoint directory with some files of a bundled one (its config.json by default)."""
    directory = tmp_path / "handed"
    directory.mkdir()
    for name in keep:
        shutil.copy(BUNDLED_DIR / folder / name, directory / name)
    return directory


# -- Moirai: config.json's distr_output -------------------------------------------------------


def test_moirai_config_naming_a_callable_is_refused_and_runs_nothing(tmp_path):
    """uni2ts' decoder would instantiate this nest (every target under ``uni2ts.`` passes its
    check) and so unpickle the payload with ``torch.load(weights_only=False)``."""
    marker, pickled = tmp_path / "ran", tmp_path / "payload.pkl"
    pickled.write_bytes(payload(marker))
    directory = bundled_copy(tmp_path, "moirai-mini", ("config.json", "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    target = "uni2ts.distribution._base.torch.load"
    config["distr_output"] = {"_target_": target, "f": str(pickled), "weights_only": False}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"distr_output '{target}'"):
        build(tmp_path, "moirai", str(directory))
    assert not marker.exists()


def test_moirai_mixture_component_naming_a_callable_is_refused(tmp_path):
    marker, pickled = tmp_path / "ran", tmp_path / "payload.pkl"
    pickled.write_bytes(payload(marker))
    directory = bundled_copy(tmp_path, "moirai-mini", ("config.json", "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    target = "uni2ts.distribution._base.torch.load"
    config["distr_output"]["components"][0] = {"_target_": target, "f": str(pickled)}
    config["distr_output"]["components"][1]["scale"] = {"_target_": target, "f": str(pickled)}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"distr_output '{target}'"):
        build(tmp_path, "moirai", str(directory))
    assert not marker.exists()


def test_moirai_distribution_argument_that_is_not_a_number_is_refused(tmp_path):
    directory = bundled_copy(tmp_path, "moirai-mini", ("config.json", "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    config["distr_output"]["components"][1]["scale"] = {"_target_": "os.system"}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"NormalFixedScaleOutput scale=.*must be a number"):
        build(tmp_path, "moirai", str(directory))


def test_moirai_bundled_config_builds_the_official_mixture(tmp_path):
    from uni2ts.distribution import MixtureOutput, NormalFixedScaleOutput

    model = build(tmp_path, "moirai", "bundled")
    mixture = model.module.distr_output
    assert isinstance(mixture, MixtureOutput)
    names = [type(c).__name__ for c in mixture.components]
    assert names == [
        "StudentTOutput",
        "NormalFixedScaleOutput",
        "NegativeBinomialOutput",
        "LogNormalOutput",
    ]
    assert isinstance(mixture.components[1], NormalFixedScaleOutput)
    assert mixture.components[1].scale == 0.001


# -- Chronos-T5: config.json's chronos_config ------------------------------------------------


def chronos_export(tmp_path, **changes) -> pathlib.Path:
    """The bundled Chronos-T5 directory with ``changes`` to its config.json's chronos_config
    (a value of None removes the key)."""
    directory = bundled_copy(tmp_path, "chronos-t5-mini", ("config.json", "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del config["chronos_config"][key]
        else:
            config["chronos_config"][key] = value
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_chronos_config_with_an_unexpected_key_names_it_and_the_expected_ones(tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    directory = chronos_export(tmp_path, extra_hook=code, top_p=None)
    with pytest.raises(CheckpointError) as refused:
        build(tmp_path, "chronos", str(directory))
    message = str(refused.value)
    assert f"{directory}/config.json" in message
    assert "unexpected keys ['extra_hook'] and lacks ['top_p']" in message
    assert "'tokenizer_class', 'tokenizer_kwargs', 'context_length'" in message
    assert not marker.exists()


@pytest.mark.parametrize(
    "name",
    [
        "__import__('pathlib').Path('{marker}').touch()",
        "ChronosBoltPipeline",  # a real callable of the chronos module, not a tokenizer
        ["MeanScaleUniformBins"],
    ],
)
def test_chronos_tokenizer_class_outside_the_allow_list_is_refused(tmp_path, name):
    marker = tmp_path / "ran"
    name = name.format(marker=marker) if isinstance(name, str) else name
    directory = chronos_export(tmp_path, tokenizer_class=name)
    expected = rf"tokenizer_class in {re.escape(str(directory))}/config\.json is "
    expected += rf"{re.escape(repr(name))}; isoprobe supports \['MeanScaleUniformBins'\]"
    with pytest.raises(CheckpointError, match=expected):
        build(tmp_path, "chronos", str(directory))
    assert not marker.exists()


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"tokenizer_kwargs": {"low_limit": -15.0, "scale": 2}}, "takes exactly"),
        ({"tokenizer_kwargs": {"low_limit": "-15", "high_limit": 15.0}}, "low_limit"),
        ({"n_tokens": "4096"}, "n_tokens='4096'"),
        ({"use_eos_token": "yes"}, "use_eos_token='yes'"),
        ({"model_type": "causal"}, "model_type='causal'"),
        ({"pad_token_id": 7}, "does not hold together"),
    ],
)
def test_chronos_config_values_of_the_wrong_kind_are_named(tmp_path, changes, named):
    directory = chronos_export(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=re.escape(named)):
        build(tmp_path, "chronos", str(directory))


@pytest.mark.parametrize(
    ("model", "bundled", "name", "dropped"),
    [
        ("chronos2", "chronos-2-mini", "Chronos-2", "quantiles"),
        ("chronos_bolt", "chronos-bolt-mini", "Chronos-Bolt", "input_patch_size"),
    ],
)
def test_chronos_config_with_an_unexpected_key_is_refused_naming_the_keys(
    tmp_path, model, bundled, name, dropped
):
    directory = bundled_copy(tmp_path, bundled, ("config.json", "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    config["chronos_config"]["extra_hook"] = "os.system"
    del config["chronos_config"][dropped]
    (directory / "config.json").write_text(json.dumps(config))
    expected = rf"{re.escape(str(directory))}/config\.json has unexpected keys \['extra_hook'\] "
    expected += rf"and lacks \['{dropped}'\]; a {name} chronos_config has the keys \['context"
    with pytest.raises(CheckpointError, match=expected):
        build(tmp_path, model, str(directory))


def test_chronos_bundled_config_reads_its_tokenizer(tmp_path):
    model = build(tmp_path, "chronos", "bundled")
    assert type(model.tokenizer).__name__ == "MeanScaleUniformBins"
    assert model.tokenizer.centers[0] == -15.0 and model.tokenizer.centers[-1] == 15.0


# -- Lag-Llama: the official Lightning .ckpt and exported directories -------------------------


def test_lag_llama_legacy_pickle_file_is_refused_and_runs_nothing(tmp_path):
    """A non-zip file: ``torch.load`` reads its first record with the pickle module's ``load``."""
    marker, path = tmp_path / "ran", tmp_path / "lag-llama.ckpt"
    path.write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=f"pickles {REFUSED}"):
        build(tmp_path, "lag_llama", str(path))
    assert not marker.exists()


def test_lag_llama_zip_checkpoint_with_a_payload_is_refused_and_runs_nothing(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "lag-llama.ckpt"
    torch.save({"hyper_parameters": {"x": TouchOnLoad(marker)}, "state_dict": {}}, path)
    with pytest.raises(CheckpointError, match=f"pickles {REFUSED}"):
        build(tmp_path, "lag_llama", str(path))
    assert not marker.exists()


def test_lag_llama_directory_with_pickled_weights_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    directory = bundled_copy(tmp_path, "lag-llama-mini")
    (directory / "model.safetensors").write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=r"model\.safetensors .*cannot be read"):
        build(tmp_path, "lag_llama", str(directory))
    assert not marker.exists()


# -- VisionTS: the published mae_visualize_vit_*.pth and exported directories ----------------


@pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
def test_visionts_pth_with_a_pickled_payload_is_refused_and_runs_nothing(tmp_path, legacy):
    """A ``{'model': ...}`` file as the published ones are, whose state dict holds a payload:
    ``torch.save``'s zip archive, or the bare pickle of torch's legacy format."""
    marker, path = tmp_path / "ran", tmp_path / "mae_visualize_vit_base.pth"
    if legacy:
        path.write_bytes(payload(marker))
    else:
        torch.save({"model": {"cls_token": TouchOnLoad(marker)}}, path)
    with pytest.raises(CheckpointError, match=f"pickles {REFUSED}"):
        build(tmp_path, "visionts", str(path))
    assert not marker.exists()


def test_visionts_export_with_a_pickled_payload_is_refused_and_runs_nothing(tmp_path):
    marker, directory = tmp_path / "ran", tmp_path / "export"
    build(tmp_path, "visionts", "scratch").export(str(directory))
    torch.save({"model": {"cls_token": TouchOnLoad(marker)}}, directory / "model.pth")
    with pytest.raises(CheckpointError, match=f"pickles {REFUSED}"):
        build(tmp_path, "visionts", str(directory))
    assert not marker.exists()


def test_visionts_export_config_with_other_keys_is_refused(tmp_path):
    directory = tmp_path / "export"
    build(tmp_path, "visionts", "scratch").export(str(directory))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "_target_": "os.system"}))
    with pytest.raises(CheckpointError, match=r"not a VisionTS export: it needs exactly the keys"):
        build(tmp_path, "visionts", str(directory))


# -- TOTEM: the published tokenizers are whole-module pickles ---------------------------------


@pytest.fixture
def official_totem_module(monkeypatch):
    """A module importable as TOTEM's ``lib.models.vqvae``, with a stand-in ``vqvae`` class of
    the official qualified name, so that ``torch.save`` writes the pickle a TOTEM file has."""
    import sys
    import types

    modules = {name: types.ModuleType(name) for name in ("lib", "lib.models", "lib.models.vqvae")}

    class vqvae(torch.nn.Module):  # noqa: N801 (the official class name)
        def __init__(self, marker: pathlib.Path) -> None:
            super().__init__()
            self.compression_factor = 4
            self.encoder = torch.nn.Conv1d(1, 2, 3)
            self.hook = TouchOnLoad(marker)

    vqvae.__module__, vqvae.__qualname__ = "lib.models.vqvae", "vqvae"
    modules["lib.models.vqvae"].vqvae = vqvae
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return vqvae


def test_totem_pickle_naming_a_global_outside_the_allow_list_is_refused(
    tmp_path, official_totem_module
):
    from isoprobe.models.totem.checkpoint import load_totem_tokenizer

    marker, path = tmp_path / "ran", tmp_path / "totem.pth"
    torch.save(official_totem_module(marker), path)
    with pytest.raises(CheckpointError, match=f"pickles {REFUSED}, which is not on the allow"):
        load_totem_tokenizer(path)
    assert not marker.exists()


def test_totem_legacy_pickle_file_is_refused_and_runs_nothing(tmp_path):
    from isoprobe.models.totem.checkpoint import load_totem_tokenizer

    marker, path = tmp_path / "ran", tmp_path / "totem.pth"
    path.write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=f"pickles {REFUSED}"):
        load_totem_tokenizer(path)
    assert not marker.exists()


def test_image_baseline_directory_with_pickled_weights_is_refused_and_runs_nothing(tmp_path):
    """experiment=rank/embedding_spectra's ViT reads a local directory through the project's
    loader: a ``pytorch_model.bin`` holding a payload is refused by its global."""
    from transformers import ViTConfig

    from isoprobe.spectra.baselines import VitImageEmbedder

    marker, directory = tmp_path / "ran", tmp_path / "vit"
    ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1).save_pretrained(directory)
    (directory / "pytorch_model.bin").write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=REFUSED):
        VitImageEmbedder(checkpoint=str(directory), images=1)


# -- Time-MoE: a published directory names its Python files in config.json's auto_map ---------

TIME_MOE_FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "time_moe"


def time_moe_directory(tmp_path, marker: pathlib.Path) -> pathlib.Path:
    """The parity fixture (official layout: auto_map, bfloat16 weights) with the Python files
    its auto_map names beside it, each creating ``marker`` if it were ever imported."""
    directory = tmp_path / "handed"
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(TIME_MOE_FIXTURE / name, directory / name)
    auto_map = json.loads((directory / "config.json").read_text())["auto_map"]
    assert set(auto_map) == {"AutoConfig", "AutoModelForCausalLM"}
    for target in auto_map.values():
        module = target.split(".")[0]
        (directory / f"{module}.py").write_text(
            f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        )
    return directory


def test_time_moe_directory_whose_auto_map_code_would_run_loads_as_data_only(tmp_path):
    """The load succeeds, reading config.json and the weights as data: the files auto_map
    names are never imported (no marker), and the weights are the published ones."""
    marker = tmp_path / "ran"
    directory = time_moe_directory(tmp_path, marker)
    model = build(tmp_path, "time_moe", str(directory))
    assert not marker.exists()
    assert model.shape.num_hidden_layers == 2
    published = load_file(directory / "model.safetensors")
    loaded = model.network.state_dict()
    assert all(torch.equal(loaded[k], v.float()) for k, v in published.items())


def test_time_moe_directory_with_pickled_weights_only_is_refused_and_runs_nothing(tmp_path):
    """No model.safetensors but a payload pytorch_model.bin: refused without reading it."""
    marker = tmp_path / "ran"
    directory = time_moe_directory(tmp_path, marker)
    (directory / "model.safetensors").unlink()
    torch.save({"weight": TouchOnLoad(marker)}, directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"holds no model\.safetensors"):
        build(tmp_path, "time_moe", str(directory))
    assert not marker.exists()


def test_time_moe_weights_file_holding_a_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    directory = time_moe_directory(tmp_path, marker)
    (directory / "model.safetensors").write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=r"model\.safetensors .*cannot be read"):
        build(tmp_path, "time_moe", str(directory))
    assert not marker.exists()


# -- models published as model.safetensors beside config.json, from a directory or the hub ----

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


@dataclass(frozen=True)
class Published:
    """A model whose published checkpoint is config.json beside model.safetensors, as its
    parity fixture lays it out: the hub id, the settings that build the fixture's shape, and
    pairs of (isoprobe's name, the published name) of tensors that must load equal."""

    model: str
    hub_id: str
    loads_equal: tuple[tuple[str, str], ...]
    settings: tuple[str, ...] = ()
    #: the published config.json describes no architecture (the settings give the shape)
    blank_config: bool = False
    #: the Python files the config's ``auto_map`` names, written beside it as payloads
    remote_code: tuple[str, ...] = ()


TIMESFM25_CONFIG = json.loads((FIXTURES / "timesfm25" / "config.json").read_text())
PUBLISHED = {
    case.model: case
    for case in (
        Published(
            "timesfm25",
            "google/timesfm-2.5-200m-pytorch",
            (("stacked_xf.0.ff.ff0.weight", "stacked_xf.0.ff0.weight"),),
            # the fixture's tiny shape as the published one
            settings=tuple(
                f"model.sizes.official_200m.{key}={value}"
                for key, value in TIMESFM25_CONFIG.items()
                if key not in ("model_type", "quantiles", "decode_index")
            ),
            blank_config=True,
        ),
        Published(
            "moirai2",
            "Salesforce/moirai-2.0-R-small",
            (("encoder.layers.0.ffn.fc1.weight", "encoder.layers.0.ffn.fc1.weight"),),
        ),
        Published(
            "toto",
            "Datadog/Toto-Open-Base-1.0",
            (("blocks.1.time.mlp.2.weight", "model.transformer.layers.3.mlp.2.weight"),),
        ),
        Published(
            "sundial",
            "thuml/sundial-base-128m",
            (
                ("layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.q_proj.weight"),
                ("head.net.final_layer.linear.weight", "flow_loss.net.final_layer.linear.weight"),
            ),
            remote_code=("configuration_sundial.py", "modeling_sundial.py"),
        ),
    )
}


def published_directory(case: Published, directory: pathlib.Path, marker: pathlib.Path):
    """The parity fixture's checkpoint in the published layout, with a pickled
    ``pytorch_model.bin`` beside it that creates ``marker`` if unpickled, and the remote code's
    files as payloads that create it if imported."""
    directory.mkdir(parents=True)
    fixture = FIXTURES / case.model
    shutil.copy(fixture / "model.safetensors", directory / "model.safetensors")
    if case.blank_config:
        (directory / "config.json").write_text("{}")
    else:
        shutil.copy(fixture / "config.json", directory / "config.json")
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    for name in case.remote_code:
        (directory / name).write_text(code)
    torch.save({"weight": TouchOnLoad(marker)}, directory / "pytorch_model.bin")
    return directory


def hub_cache(tmp_path, monkeypatch, repo: str) -> pathlib.Path:
    """An empty snapshot of ``repo`` in a Hugging Face cache under ``tmp_path`` that the hub
    client reads (offline, as the tests run)."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    folder = cache / f"models--{repo.replace('/', '--')}"
    revision = "0" * 40
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(revision)
    return folder / "snapshots" / revision


def published_checkpoint(
    case: Published, tmp_path, monkeypatch, marker: pathlib.Path, where: str
) -> tuple[str, pathlib.Path]:
    """``model.checkpoint`` and the folder it reads, for a local directory or the hub id's
    cached snapshot."""
    if where == "hub":
        cache = hub_cache(tmp_path, monkeypatch, case.hub_id)
        return case.hub_id, published_directory(case, cache, marker)
    directory = published_directory(case, tmp_path / "handed", marker)
    return str(directory), directory


def build_published(case: Published, tmp_path, checkpoint: str):
    return built_model(tmp_path, case.model, checkpoint, 24, 8, case.settings)


@pytest.mark.parametrize("where", ["directory", "hub"])
@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_published_weights_load_as_data_from_a_directory_and_the_hub(
    tmp_path, monkeypatch, model, where
):
    """The published layout loads, from a directory or the hub id's cached snapshot, reading
    only model.safetensors and config.json: neither the pickle beside them nor the remote code
    a config's ``auto_map`` names runs."""
    case, marker = PUBLISHED[model], tmp_path / "ran"
    checkpoint, _ = published_checkpoint(case, tmp_path, monkeypatch, marker, where)
    loaded_model = build_published(case, tmp_path, checkpoint)
    assert loaded_model.resolved_checkpoint.kind == ("hub" if where == "hub" else "path")
    assert not marker.exists()
    published = load_file(FIXTURES / model / "model.safetensors")
    loaded = loaded_model.network.state_dict()
    for ours, theirs in case.loads_equal:
        assert loaded[ours].equal(published[theirs].float())
    assert len(loaded) == len(published)


@pytest.mark.parametrize("where", ["directory", "hub"])
@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_published_weights_file_holding_a_pickle_is_refused_and_runs_nothing(
    tmp_path, monkeypatch, model, where
):
    case, marker = PUBLISHED[model], tmp_path / "ran"
    checkpoint, directory = published_checkpoint(case, tmp_path, monkeypatch, marker, where)
    (directory / "model.safetensors").write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=r"model\.safetensors .*cannot be read"):
        build_published(case, tmp_path, checkpoint)
    assert not marker.exists()


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_published_directory_with_pickled_weights_only_is_refused_and_runs_nothing(tmp_path, model):
    case, marker = PUBLISHED[model], tmp_path / "ran"
    directory = published_directory(case, tmp_path / "handed", marker)
    (directory / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"holds no model\.safetensors"):
        build_published(case, tmp_path, str(directory))
    assert not marker.exists()


@pytest.mark.parametrize("where", ["directory", "hub"])
def test_moirai2_config_naming_code_is_refused_and_runs_nothing(tmp_path, monkeypatch, where):
    """A config.json that names a callable (Hydra's ``_target_``) and asks for remote code
    (``auto_map``) beside a module that would create the marker: refused by its keys."""
    case, marker = PUBLISHED["moirai2"], tmp_path / "ran"
    checkpoint, directory = published_checkpoint(case, tmp_path, monkeypatch, marker, where)
    config = json.loads((directory / "config.json").read_text())
    config["_target_"] = f"{touch_marker.__module__}.{touch_marker.__name__}"
    config["auto_map"] = {"AutoModel": "modeling_handed.Handed"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "modeling_handed.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    )
    with pytest.raises(CheckpointError, match=r"unexpected keys \['_target_', 'auto_map'\]"):
        build_published(case, tmp_path, checkpoint)
    assert not marker.exists()


# -- models read through transformers ---------------------------------------------------------


@pytest.mark.parametrize("model", sorted(TRANSFORMERS_MODELS))
def test_pickled_pytorch_weights_are_refused_and_run_nothing(tmp_path, model):
    """A directory with a pickle ``pytorch_model.bin`` and no safetensors: transformers reads
    it with ``weights_only=True``, and the refusal names the global."""
    marker = tmp_path / "ran"
    directory = bundled_copy(tmp_path, TRANSFORMERS_MODELS[model])
    if model == "llm":
        shutil.copy(BUNDLED_DIR / "llm-gpt2-mini" / "llmtime_vocabulary.json", directory)
    torch.save({"weight": TouchOnLoad(marker)}, directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=REFUSED):
        build(tmp_path, model, str(directory))
    assert not marker.exists()


@pytest.mark.parametrize("model", sorted(TRANSFORMERS_MODELS))
def test_config_asking_for_remote_code_is_refused_and_runs_nothing(tmp_path, model):
    """A config.json whose ``auto_map`` points at Python shipped beside it."""
    marker = tmp_path / "ran"
    directory = bundled_copy(tmp_path, TRANSFORMERS_MODELS[model])
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "handed_model"
    config["auto_map"] = {"AutoConfig": "configuration_handed.HandedConfig"}
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "configuration_handed.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import PretrainedConfig\n"
        "class HandedConfig(PretrainedConfig):\n    model_type = 'handed_model'\n"
    )
    with pytest.raises(CheckpointError, match=r"auto_map"):
        build(tmp_path, model, str(directory))
    assert not marker.exists()


# -- the text LLM: a directory's own tokenizer ------------------------------------------------


def gpt2_tokenizer_directory(tmp_path, symbols: str, merges: tuple[str, ...] = ()) -> pathlib.Path:
    """The bundled GPT-2 weights with a byte-level BPE tokenizer of its own (vocab.json,
    merges.txt) that knows only ``<|endoftext|>`` and the characters ``symbols``."""
    directory = bundled_copy(tmp_path, "llm-gpt2-mini", ("config.json", "model.safetensors"))
    vocabulary = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(symbols)}}
    (directory / "vocab.json").write_text(json.dumps(vocabulary))
    (directory / "merges.txt").write_text("\n".join(["#version: 0.2", *merges]) + "\n")
    return directory


@pytest.mark.parametrize(
    "symbols, lacking", [("0123456789,-", "['NaN']"), ("0123456789", "[',', '-', 'NaN']")]
)
def test_llm_tokenizer_that_lacks_symbols_is_named_with_what_it_lacks(tmp_path, symbols, lacking):
    directory = gpt2_tokenizer_directory(tmp_path, symbols)
    expected = rf"the tokenizer of {re.escape(str(directory))} cannot write LLMTime series: "
    expected += rf"it lacks {re.escape(lacking)}"
    with pytest.raises(CheckpointError, match=expected):
        build(tmp_path, "llm", str(directory))


def test_llm_tokenizer_files_that_do_not_hold_together_are_named(tmp_path):
    """merges.txt merging a character vocab.json lacks: the tokenizers library's bare
    ``Exception``."""
    directory = gpt2_tokenizer_directory(tmp_path, "0123456789", merges=("\u0120 0",))
    with pytest.raises(CheckpointError, match=rf"tokenizer files in {re.escape(str(directory))}"):
        build(tmp_path, "llm", str(directory))


@pytest.mark.parametrize(
    "content, named",
    [
        ("[1, 2]", "is not a JSON object with a list of tokens"),
        ('{"tokens": "0123"}', "'tokens' must be a list of distinct strings"),
        ('{"tokens": ["0", "0"]}', "'tokens' must be a list of distinct strings"),
        ('{"tokens": ["<pad>", "<eos>", "0"]}', "a character vocabulary needs the tokens"),
    ],
)
def test_llm_character_vocabulary_file_that_is_not_one_is_named(tmp_path, content, named):
    directory = bundled_copy(tmp_path, "llm-gpt2-mini", ("config.json", "model.safetensors"))
    (directory / "llmtime_vocabulary.json").write_text(content)
    with pytest.raises(CheckpointError, match=rf"llmtime_vocabulary\.json.*{re.escape(named)}"):
        build(tmp_path, "llm", str(directory))


# -- compressed exports, resume checkpoints, data files ---------------------------------------


def test_compressed_export_with_pickled_factors_is_refused_and_runs_nothing(tmp_path):
    from isoprobe.models.compression_files import COMPRESSION_JSON, COMPRESSION_WEIGHTS

    marker = tmp_path / "ran"
    directory = bundled_copy(tmp_path, "chronos-bolt-mini", ("config.json", "model.safetensors"))
    projection = {
        "block": "encoder.0",
        "projection": "q",
        "module": "encoder.block.0.layer.0.SelfAttention.q",
        "out_features": 128,
        "in_features": 128,
        "rank": 4,
        "status": "factored",
    }
    (directory / COMPRESSION_JSON).write_text(json.dumps({"projections": [projection]}))
    (directory / COMPRESSION_WEIGHTS).write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=rf"{COMPRESSION_WEIGHTS}.*cannot be read"):
        build(tmp_path, "chronos_bolt", str(directory))
    assert not marker.exists()


def test_resume_checkpoint_with_a_payload_names_the_refused_global(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "payload": TouchOnLoad(marker)}, path)
    with pytest.raises(CheckpointError, match=REFUSED):
        read_checkpoint(str(path))
    assert not marker.exists()


def test_resume_legacy_pickle_file_names_the_refused_global(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "last.ckpt"
    path.write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=REFUSED):
        read_checkpoint(str(path))
    assert not marker.exists()


class SystemOnLoad:
    """Unpickling this runs a shell command that creates ``marker`` (``os.system``, pickled as
    ``posix.system``, a module torch's weights-only loader blocks by name)."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


#: how each kind of file holds the payload: torch.save's zip archive, or a bare pickle of each
#: protocol (torch's error names the global for 2; for 0, 4 and 5 it stops at an opcode first)
SYSTEM_PAYLOADS = {
    "zip": lambda path, marker: torch.save({"state_dict": {}, "x": SystemOnLoad(marker)}, path),
    **{
        f"pickle-protocol-{protocol}": lambda path, marker, protocol=protocol: path.write_bytes(
            pickle.dumps({"state_dict": {}, "x": [SystemOnLoad(marker)]}, protocol=protocol)
        )
        for protocol in (0, 2, 4, 5)
    },
}


@pytest.mark.parametrize("kind", sorted(SYSTEM_PAYLOADS))
def test_resume_checkpoint_calling_os_system_names_it_and_runs_nothing(tmp_path, kind):
    marker, path = tmp_path / "ran", tmp_path / "last.ckpt"
    SYSTEM_PAYLOADS[kind](path, marker)
    system = f"{os.system.__module__}.system"  # posix.system (nt.system on Windows)
    with pytest.raises(
        CheckpointError, match=rf"ckpt_path={re.escape(str(path))} pickles {system}:"
    ):
        read_checkpoint(str(path))
    assert not marker.exists()


def test_resume_file_that_is_no_pickle_says_what_stopped_the_reader(tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"\x80\x02}q\x00\xff\xfe")  # a pickle header, then an unknown opcode
    with pytest.raises(CheckpointError, match=r"is not a PyTorch checkpoint that can be read .*\("):
        read_checkpoint(str(path))


def _pickled_extension_table(marker: pathlib.Path) -> pa.Table:
    """A table whose column declares pyarrow's pickled ``arrow.py_extension_type``: a reader
    that honoured it would unpickle the metadata."""
    field = pa.field(
        "target",
        pa.list_(pa.float64()),
        metadata={
            b"ARROW:extension:name": b"arrow.py_extension_type",
            b"ARROW:extension:metadata": payload(marker),
        },
    )
    values = pa.array([[1.0, 2.0, 3.0, 4.0] * 20], type=pa.list_(pa.float64()))
    return pa.Table.from_arrays([values], schema=pa.schema([field]))


@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_data_file_with_a_pickled_extension_type_runs_nothing(tmp_path, suffix):
    marker, path = tmp_path / "ran", tmp_path / f"series{suffix}"
    table = _pickled_extension_table(marker)
    if suffix == ".arrow":
        pyarrow.feather.write_feather(table, path)
    else:
        pyarrow.parquet.write_table(table, path)
    try:
        collection = load_local(str(path))
    except LocalDataError:
        pass  # refusing the file is fine; running its code is not
    else:
        assert len(collection.series[0]) == 80  # read as the plain list column it stores
    assert not marker.exists()


# -- task=analyze: a run's saved window means ---------------------------------------------------


@pytest.mark.parametrize("kind", ["pickle", "torch.save"])
def test_window_means_file_holding_a_pickle_is_refused_and_runs_nothing(tmp_path, kind):
    marker, path = tmp_path / "ran", tmp_path / "last.safetensors"
    if kind == "pickle":
        path.write_bytes(payload(marker))
    else:
        torch.save({"mean/encoder.0": TouchOnLoad(marker)}, path)
    with pytest.raises(WindowMeansError, match=f"{re.escape(str(path))} is not a safetensors"):
        read_window_means(path)
    assert not marker.exists()


# -- TiRex: the published model.ckpt (a pickle) through the allow-list; exports as safetensors --


def tirex_checkpoint(path: pathlib.Path, **extra) -> pathlib.Path:
    """The TiRex parity fixture as the published Lightning checkpoint (``model.ckpt``), with
    ``extra`` entries beside its state_dict and hyper_parameters."""
    from tests.models.test_tirex import hyper_parameters, published_weights

    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint = {"state_dict": published_weights(), "hyper_parameters": hyper_parameters()}
    torch.save({**checkpoint, **extra}, path)
    return path


def build_tirex(tmp_path, checkpoint: str):
    cfg = compose_config(tmp_path, ["model=tirex", f"model.checkpoint={checkpoint}"])
    windows = SimpleNamespace(context_length=24, prediction_length=8, season_length=1, freq="h")
    return build_model(cfg.model, windows)


def tirex_hub_snapshot(tmp_path, monkeypatch) -> pathlib.Path:
    """NX-AI/TiRex's cached snapshot (config.json, which the cache check reads, and the
    checkpoint's place)."""
    snapshot = hub_cache(tmp_path, monkeypatch, "NX-AI/TiRex")
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    return snapshot / "model.ckpt"


@pytest.mark.parametrize("where", ["file", "hub"])
def test_tirex_published_checkpoint_loads_through_the_allow_list(tmp_path, monkeypatch, where):
    if where == "hub":
        tirex_checkpoint(tirex_hub_snapshot(tmp_path, monkeypatch))
        model = build_tirex(tmp_path, "NX-AI/TiRex")
        assert model.resolved_checkpoint.kind == "hub"
    else:
        model = build_tirex(tmp_path, str(tirex_checkpoint(tmp_path / "handed" / "model.ckpt")))
    assert model.network.out_norm.weight.isfinite().all()
    assert model.shape.embedding_dim == 16


@pytest.mark.parametrize("where", ["file", "directory", "hub"])
def test_tirex_checkpoint_holding_a_payload_is_refused_and_runs_nothing(
    tmp_path, monkeypatch, where
):
    marker = tmp_path / "ran"
    if where == "hub":
        tirex_checkpoint(tirex_hub_snapshot(tmp_path, monkeypatch), loops=TouchOnLoad(marker))
        checkpoint = "NX-AI/TiRex"
    else:
        path = tirex_checkpoint(tmp_path / "handed" / "model.ckpt", loops=TouchOnLoad(marker))
        checkpoint = str(path if where == "file" else path.parent)
    with pytest.raises(CheckpointError, match=rf"cannot be loaded safely.*{REFUSED}"):
        build_tirex(tmp_path, checkpoint)
    assert not marker.exists()


def test_tirex_export_whose_weights_file_is_a_pickle_is_refused_and_runs_nothing(tmp_path):
    from tests.models.test_tirex import export_directory

    marker = tmp_path / "ran"
    directory = export_directory(tmp_path / "handed")
    (directory / "model.safetensors").write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match=r"model\.safetensors .*cannot be read"):
        build_tirex(tmp_path, str(directory))
